"""The val split: its own examples, kept apart from train and test by scoring, same bits every time.

The reference for "equal" is the rows' tokens compared as Python tuples, not the fingerprints the task
filters with."""
import pytest
import torch

from sandbox.tasks import make_task
from sandbox.tasks.rng import row_fingerprint

# 3 keys from 4 keys and 4 values in 12 positions: so few distinct examples that the splits collide often
TINY = dict(seq_len=12, num_kv_pairs=3, vocab_size=10, val_examples=300, test_examples=500)
TINY_DISTANCE = dict(seq_len=20, num_kv_pairs=2, vocab_size=8, noise_vocab_size=1, prefix=2, distance=6,
                     val_examples=200, test_examples=200)


def _rows(x):
    return [tuple(r) for r in x.tolist()]


def _split(task, split):
    x, y = zip(*task.eval_batches(split, 128))
    return torch.cat(x), torch.cat(y)


@pytest.mark.parametrize("kw", [TINY, TINY_DISTANCE])
def test_no_example_is_scored_in_two_splits(kw):
    task = make_task("mqar", seed=0, **kw)
    val_x, val_y = _split(task, "val")
    test_x, _ = _split(task, "test")
    test = set(_rows(test_x))
    val_scored = {r for r, s in zip(_rows(val_x), (val_y != -100).any(1).tolist()) if s}
    train_x, train_y = task.sample(3000, "train", 0)
    train_scored = {r for r, s in zip(_rows(train_x), (train_y != -100).any(1).tolist()) if s}
    assert not val_scored & test and not train_scored & test and not train_scored & set(_rows(val_x))
    # and the filter drops nothing else: a val row loses its targets exactly when it equals a test row
    raw_val_y = task.examples(torch.arange(kw["val_examples"]), "val")[1]
    for r, got, raw in zip(_rows(val_x), val_y, raw_val_y):
        assert torch.equal(got, torch.full_like(raw, -100) if r in test else raw)


@pytest.mark.parametrize("kw", [TINY, TINY_DISTANCE])
def test_train_rows_equal_to_a_val_example_are_unscored(kw):
    task = make_task("mqar", seed=0, **kw)
    val, test = set(_rows(_split(task, "val")[0])), set(_rows(_split(task, "test")[0]))
    x, y = task.sample(3000, "train", 0)
    raw_y = task.examples(torch.arange(3000), "train")[1]
    assert sum(r in val and r not in test for r in _rows(x)) > 10, "the tiny task should collide with val alone"
    for got, raw, r in zip(y, raw_y, _rows(x)):
        assert torch.equal(got, torch.full_like(raw, -100) if r in val or r in test else raw)


def test_val_gives_the_same_bits_twice_however_it_is_cut():
    kw = dict(seq_len=64, num_kv_pairs=4, vocab_size=256, val_examples=300)
    a, b = make_task("mqar", seed=7, **kw), make_task("mqar", seed=7, **kw)
    whole_a, whole_b = _split(a, "val"), _split(b, "val")
    assert whole_a[0].shape == (300, 64)
    assert torch.equal(whole_a[0], whole_b[0]) and torch.equal(whole_a[1], whole_b[1])
    x, y = a.sample(50, "val", 2, count=2)                                # rows 100 .. 199
    assert torch.equal(x, whole_a[0][100:200]) and torch.equal(y, whole_a[1][100:200])
    assert not torch.equal(_split(make_task("mqar", seed=8, **kw), "val")[0], whole_a[0])


def test_val_differs_from_test_and_train():
    task = make_task("mqar", seq_len=64, num_kv_pairs=4, vocab_size=256, seed=0)
    val, test = _split(task, "val")[0], _split(task, "test")[0]
    train = task.sample(1024, "train", 0)[0]
    assert val.shape == test.shape == (1024, 64)
    # a large space: the three streams share no row at all (ids 0 .. 1023 of each)
    assert not set(_rows(val)) & set(_rows(test)) and not set(_rows(val)) & set(_rows(train))
    # a val row is checked against the test split's examples alone
    fp = row_fingerprint(task.examples(torch.arange(1024), "test")[0]).sort().values
    assert torch.equal(task.held_out_fingerprints("val"), fp)


def test_held_out_splits_are_bounded():
    task = make_task("mqar", seq_len=16, num_kv_pairs=2, vocab_size=16, val_examples=40, test_examples=30)
    assert sum(x.shape[0] for x, _ in task.eval_batches("val", 16)) == 40
    task.sample(20, "val", 1)
    with pytest.raises(IndexError, match="val split has 40 examples"):
        task.sample(20, "val", 2)
    with pytest.raises(ValueError, match="^split: 'train' is unbounded"):
        next(task.eval_batches("train", 8))
    with pytest.raises(ValueError, match="^split: must be one of 'train', 'test', 'val', got 'dev'"):
        task.sample(4, "dev")
    with pytest.raises(ValueError, match="^val_examples: must be >= 1, got 0"):
        make_task("mqar", val_examples=0)


def test_a_fixed_training_set_revisits_its_examples_each_epoch():
    task = make_task("mqar", seq_len=32, num_kv_pairs=4, vocab_size=64, train_examples=10, seed=3)
    free = make_task("mqar", seq_len=32, num_kv_pairs=4, vocab_size=64, seed=3)
    x, y = task.sample(4, "train", 3)                        # examples 12..15 of an epoch of 10: 2..5
    x2, y2 = free.sample(2, "train", 1)                      # examples 2, 3 of the unbounded stream
    x4, y4 = free.sample(2, "train", 2)                      # examples 4, 5
    assert torch.equal(x, torch.cat([x2, x4])) and torch.equal(y, torch.cat([y2, y4]))
    many, _ = task.sample(4, "train", 0, count=5)             # 20 rows: two epochs
    assert torch.equal(many[:10], many[10:])
    assert len({tuple(r.tolist()) for r in many}) == 10
