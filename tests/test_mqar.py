"""The MQAR generator against counts computed independently with plain Python loops."""
import hashlib

import pytest
import torch

from sandbox.tasks import TrainBatches, make_task


def _check_example(x, y, kv, V, gap=0, noise=0, noise_vocab=0, prefix=0):
    x, y = x.tolist(), y.tolist()
    assert all(V <= t < V + noise_vocab for t in x[:prefix]), "the prefix must be noise tokens"
    x, y = x[prefix:], y[prefix:]
    T = len(x)
    ctx = x[: 2 * kv]
    keys, values = ctx[0::2], ctx[1::2]
    assert all(1 <= k < V // 2 for k in keys), "keys outside [1, V/2)"
    assert all(V // 2 <= v < V for v in values), "values outside [V/2, V)"
    assert len(set(keys)) == kv and len(set(values)) == kv
    pair = dict(zip(keys, values))
    inserted = x[2 * kv: 2 * kv + gap + noise]
    if gap:
        assert inserted == [0] * gap
    if noise:
        assert all(V <= t < V + noise_vocab for t in inserted)
    start = 2 * kv + gap + noise
    queried = []
    for t in range(T):
        if y[t] != -100:
            assert t >= start and (t - start) % 2 == 0, "query off the even grid of the query region"
            assert x[t] in pair, "a query key that is not in the context"
            assert y[t] == pair[x[t]], "label is not the paired value"
            queried.append(x[t])
    assert sorted(queried) == sorted(keys), "each key must be queried exactly once"
    for t in range(start, T):
        if y[t] == -100:
            if noise:
                assert V <= x[t] < V + noise_vocab, "query-region filler must be noise"
            else:
                assert x[t] == 0, "query-region filler must be 0"


@pytest.mark.parametrize("kw", [dict(seq_len=64, num_kv_pairs=4, vocab_size=64),
                                dict(seq_len=97, num_kv_pairs=8, vocab_size=8192),
                                dict(seq_len=80, num_kv_pairs=4, vocab_size=32, gap=20),
                                dict(seq_len=80, num_kv_pairs=4, vocab_size=32, noise=20, noise_vocab_size=7),
                                dict(seq_len=90, num_kv_pairs=4, vocab_size=32, gap=20, prefix=10),
                                dict(seq_len=90, num_kv_pairs=4, vocab_size=32, noise=20, prefix=10)])
def test_examples_follow_the_documented_layout(kw):
    task = make_task("mqar", seed=3, **kw)
    noise_vocab = task.noise_vocab
    x, y = task.sample(32, "train", 5)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (32, kw["seq_len"])
    for i in range(32):
        _check_example(x[i], y[i], kw["num_kv_pairs"], kw["vocab_size"], kw.get("gap", 0),
                       kw.get("noise", 0), noise_vocab, kw.get("prefix", 0))
    if kw.get("noise") or kw.get("prefix"):
        assert task.vocab_size == kw["vocab_size"] + noise_vocab
        assert int(x.max()) < task.vocab_size


def test_same_seed_split_index_gives_same_bits_and_batches_tile():
    a = make_task("mqar", seq_len=64, num_kv_pairs=4, vocab_size=128, seed=1)
    b = make_task("mqar", seq_len=64, num_kv_pairs=4, vocab_size=128, seed=1)
    x1, y1 = a.sample(8, "train", 3)
    x2, y2 = b.sample(8, "train", 3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    # example identity does not depend on how the stream is cut into batches
    x4, _ = a.sample(4, "train", 7)
    assert torch.equal(x4, x1[4:])
    assert not torch.equal(a.sample(8, "train", 4)[0], x1)
    assert not torch.equal(make_task("mqar", seq_len=64, num_kv_pairs=4, vocab_size=128, seed=2)
                           .sample(8, "train", 3)[0], x1)


@pytest.mark.parametrize("kw", [dict(seq_len=40, num_kv_pairs=2, vocab_size=8, noise=8),
                                dict(seq_len=8, num_kv_pairs=2, vocab_size=8)])
def test_blocks_of_batches_equal_batches_one_by_one(kw):
    # the second task is so small that many training rows equal a test row (unscored)
    task = make_task("mqar", test_examples=64, seed=5, **kw)
    single = [task.sample(6, "train", i) for i in range(2, 13)]
    x, y = task.sample(6, "train", 2, count=11)
    assert torch.equal(x, torch.cat([s[0] for s in single])) and torch.equal(y, torch.cat([s[1] for s in single]))
    task.rows_per_call = 12                           # two steps per generator call
    batches = TrainBatches(task, 6, max_bytes=4 * 2 * 4 * 6 * kw["seq_len"])
    assert batches.span == 4                          # the pool holds four steps
    for step in [2, 3, 4, 5, 6, 3, 12, 7, 8]:          # forward, back (a resume), skip ahead
        got = batches[step]
        assert got[0].dtype == got[1].dtype == torch.int64
        assert torch.equal(got[0], single[step - 2][0]) and torch.equal(got[1], single[step - 2][1])
    whole = TrainBatches(task, 6, steps=20)
    assert whole.span == 20 and torch.equal(whole[12][0], single[10][0])
    if kw["seq_len"] == 8:
        assert (y == -100).all(1).sum() > 5


def test_power_law_favours_early_query_slots():
    task = make_task("mqar", seq_len=264, num_kv_pairs=4, vocab_size=256, seed=0, power_a=0.01)
    _, y = task.sample(2000, "train", 0)
    offsets = (y != -100).nonzero()[:, 1] - 8
    slots = torch.bincount(offsets // 2, minlength=128).float()
    # p(s) ~ 1/(s+1): the first quarter of the slots gets most of the queries
    assert slots[:32].sum() > 0.6 * slots.sum()
    assert slots[0] > slots[64:].mean() * 10


def test_train_never_scores_a_val_or_test_example():
    # 3 keys from a vocabulary of 4 keys and 4 values in 12 positions: tiny space, collisions certain
    task = make_task("mqar", seq_len=12, num_kv_pairs=3, vocab_size=10, seed=0, val_examples=300, test_examples=500)
    held = {tuple(r) for split in ("val", "test") for x, _ in task.eval_batches(split, 100) for r in x.tolist()}
    x, y = task.sample(2000, "train", 0)
    scored = (y != -100).any(1)
    clashes = [tuple(r) in held for r in x.tolist()]
    assert any(clashes), "the tiny task should produce some collisions to exercise the filter"
    assert scored.tolist() == [not c for c in clashes]     # exactly the rows equal to a held-out example lose theirs


# sha1 of the int64 bytes of (inputs, targets), written by the generator at b9bd818: the val split, and new
# layout options at their defaults, must keep every bit of the layouts that results were run on
PINNED = [(dict(seq_len=97, num_kv_pairs=8, vocab_size=8192), "train", 777, "be2e786648929cae70e01a1e7f083853c08bfe8a",
           "9635774efb8b91c2bd00f92953f02bccd0cf0c57"),
          (dict(seq_len=97, num_kv_pairs=8, vocab_size=8192), "test", 1, "8144b21ed2e2a0adc5a1d7ecce3af13c16e5efb2",
           "c6a4bcb1f901054723df966576bfdad2f4765084"),
          (dict(seq_len=80, num_kv_pairs=4, vocab_size=32, gap=20), "train", 777,
           "84cb32b5db58b9255e8dfd890039cfd5b621f1cb", "5f1f2caa168aa91a921751d82258a33e9f13f8f7"),
          (dict(seq_len=256, num_kv_pairs=16, vocab_size=8192, noise=64), "train", 0,
           "7a24e5c26e824984d82c735facd903b1bff8c922", "8d5c1960919e4377fe8136877cc86a2d007d6d0a"),
          (dict(seq_len=256, num_kv_pairs=16, vocab_size=8192, noise=64), "test", 1,
           "77e64a49cad755a8f2e1e32e7c86ff67ee649a0c", "94c574e6266a1c20835cfbaab4e630478ddb831f")]


@pytest.mark.parametrize("kw,split,index,x_sha,y_sha", PINNED)
def test_default_layouts_keep_their_bits(kw, split, index, x_sha, y_sha):
    x, y = make_task("mqar", seed=3, **kw).sample(64, split, index)
    assert hashlib.sha1(x.numpy().tobytes()).hexdigest() == x_sha
    assert hashlib.sha1(y.numpy().tobytes()).hexdigest() == y_sha


def test_too_short_sequence_is_rejected():
    with pytest.raises(ValueError, match="seq_len"):
        make_task("mqar", seq_len=30, num_kv_pairs=8, vocab_size=64)
    with pytest.raises(ValueError, match="seq_len"):
        make_task("mqar", seq_len=40, num_kv_pairs=8, vocab_size=64, gap=10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares the CPU with a GPU")
@pytest.mark.parametrize("kw", [dict(seq_len=256, num_kv_pairs=16), dict(seq_len=512, num_kv_pairs=64, noise=64),
                                dict(seq_len=320, num_kv_pairs=16, gap=192), dict(seq_len=64, num_kv_pairs=4),
                                dict(seq_len=320, num_kv_pairs=8, prefix=64, gap=64),
                                dict(seq_len=640, num_kv_pairs=16, prefix=64, distance=512)])
def test_gpu_batches_equal_cpu_batches_bit_for_bit(kw):
    """On a GPU the generator takes other kernels (a Triton table of uniforms, the threshold kernel for the
    kv smallest); the bits must not change, for training batches drawn through the pool, val and test batches."""
    cpu = make_task("mqar", vocab_size=8192, seed=3, **kw)
    gpu = make_task("mqar", vocab_size=8192, seed=3, device="cuda", **kw)
    for split, index in (("train", 0), ("train", 12345), ("test", 1), ("val", 2)):
        a, b = cpu.sample(128, split, index), gpu.sample(128, split, index)
        assert torch.equal(a[0], b[0].cpu()) and torch.equal(a[1], b[1].cpu()), (split, index)
    pool = TrainBatches(gpu, 64, steps=40)
    for step in (0, 17, 39):
        x, y = cpu.sample(64, "train", step)
        assert torch.equal(pool[step][0].cpu(), x) and torch.equal(pool[step][1].cpu(), y)
