"""MQAR with a prefix and queries a set distance behind their pairs (``prefix``, ``distance``), checked
against plain Python loops over the tokens."""
from collections import Counter

import pytest
import torch

from sandbox.tasks import TrainBatches
from sandbox.tasks import make_task as _make_task


def make_task(name, **kw):
    """Small held-out splits: every training batch is checked against them, and these tests need few."""
    return _make_task(name, **{"val_examples": 64, "test_examples": 64, **kw})


def _distances(x, y, kv, V, prefix, noise_vocab):
    """Per query of one row: its position minus its pair's key's, found from the tokens alone; checks the
    rest of the documented layout on the way."""
    x, y = x.tolist(), y.tolist()
    assert all(V <= t < V + noise_vocab for t in x[:prefix]), "the prefix must be noise tokens"
    ctx = x[prefix:prefix + 2 * kv]
    keys, values = ctx[0::2], ctx[1::2]
    assert all(1 <= k < V // 2 for k in keys) and all(V // 2 <= v < V for v in values)
    assert len(set(keys)) == kv and len(set(values)) == kv
    where = {k: prefix + 2 * i for i, k in enumerate(keys)}
    out = []
    for t, (tok, target) in enumerate(zip(x, y)):
        if target != -100:
            assert tok in where and target == values[keys.index(tok)], "a query must ask a context key"
            out.append(t - where[tok])
        elif not prefix <= t < prefix + 2 * kv:
            assert V <= tok < V + noise_vocab, f"position {t}: outside pairs and queries every token is noise"
    assert len(out) == kv, "each key is queried exactly once"
    return out


@pytest.mark.parametrize("kv,prefix,distance,seq_len", [(4, 16, 2, 40), (4, 16, 32, 96), (8, 64, 256, 400),
                                                         (1, 5, 9, 20)])
def test_every_query_sits_the_stated_distance_behind_its_pair(kv, prefix, distance, seq_len):
    task = make_task("mqar", seq_len=seq_len, num_kv_pairs=kv, vocab_size=64, prefix=prefix, distance=distance,
                     seed=4)
    x, y = task.sample(400, "train", 3)
    seen = Counter()
    for i in range(x.shape[0]):
        d = _distances(x[i], y[i], kv, 64, prefix, task.noise_vocab)
        assert all(distance <= e <= distance + 4 * (kv - 1) for e in d), d
        seen.update(d)
    # both ends of the band [D, D + 4(kv-1)] are reached: it is no wider than it needs to be
    assert min(seen) == distance and max(seen) == distance + 4 * (kv - 1)
    assert task.vocab_size == 64 + task.noise_vocab and int(x.max()) < task.vocab_size


def test_queries_come_in_a_uniform_random_order():
    kv, rows = 4, 2000
    task = make_task("mqar", seq_len=64, num_kv_pairs=kv, vocab_size=64, prefix=8, distance=20, seed=0)
    x, y = task.sample(rows, "train", 0)
    first = 8 + 2 * kv - 2 + 20                                      # the first query slot
    pairs = x[:, 8:8 + 2 * kv:2]                                       # [rows, kv] keys in pair order
    queried = x[:, first:first + 2 * kv:2]                              # [rows, kv] keys in slot order
    pair_of_slot = (queried[:, :, None] == pairs[:, None, :]).int().argmax(-1)
    counts = torch.stack([torch.bincount(pair_of_slot[:, s], minlength=kv) for s in range(kv)], 1).float()
    # each (pair, slot) cell expects rows / kv = 500 hits (sd 19): the order carries no position of a pair
    assert (counts - rows / kv).abs().max() < 90


def test_the_prefix_is_random_noise():
    task = make_task("mqar", seq_len=80, num_kv_pairs=4, vocab_size=64, noise_vocab_size=50, prefix=16,
                     distance=40, seed=1)
    x, _ = task.sample(64, "train", 0)
    prefix = x[:, :16]
    assert ((prefix >= 64) & (prefix < 64 + 50)).all()
    # not one constant token: every position of the prefix takes many tokens, and the rows differ
    assert min(len(set(prefix[:, p].tolist())) for p in range(16)) > 20
    assert len({tuple(r) for r in prefix.tolist()}) == 64


def test_same_bits_twice_and_in_blocks():
    kw = dict(seq_len=96, num_kv_pairs=4, vocab_size=64, prefix=16, distance=32)
    a, b = make_task("mqar", seed=2, **kw), make_task("mqar", seed=2, **kw)
    for split, index in (("train", 5), ("val", 1), ("test", 2)):
        xa, ya = a.sample(16, split, index)
        xb, yb = b.sample(16, split, index)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    single = [a.sample(8, "train", i) for i in range(4)]
    x, y = a.sample(8, "train", 0, count=4)
    assert torch.equal(x, torch.cat([s[0] for s in single])) and torch.equal(y, torch.cat([s[1] for s in single]))
    assert torch.equal(TrainBatches(a, 8, steps=4)[3][1], single[3][1])
    assert not torch.equal(make_task("mqar", seed=3, **kw).sample(16, "train", 5)[0], a.sample(16, "train", 5)[0])


@pytest.mark.parametrize("params,message", [
    (dict(distance=1), r"^distance: must be 0 \(off\) or >= 2"),
    (dict(distance=-3), r"^distance: must be 0 \(off\) or >= 2"),
    (dict(distance=8, gap=4), r"^distance: excludes gap and noise"),
    (dict(distance=8, noise=4), r"^distance: excludes gap and noise"),
    (dict(prefix=-1), r"^prefix: must be >= 0, got -1"),
    (dict(prefix=8, distance=30), r"^seq_len: 48 is too short for distance=30 .* = 52$"),   # 8 + 16 - 2 + 30
    (dict(prefix=40, gap=1), r"^seq_len: 48 is too short .* = 57$"),                         # 40 + 16 + 1
])
def test_impossible_layouts_are_rejected_in_one_line(params, message):
    with pytest.raises(ValueError, match=message) as err:
        make_task("mqar", seq_len=48, num_kv_pairs=4, vocab_size=64, **params)
    assert "\n" not in str(err.value)


def test_the_tightest_lengths_fit():
    # the bounds the errors state are exact: at the shortest length the last query slot is the last even
    # position, and the queries fill every slot of their region
    task = make_task("mqar", seq_len=52, num_kv_pairs=4, vocab_size=64, prefix=8, distance=30)
    x, y = task.sample(4, "train", 0)
    assert (y[:, 50] != -100).all() and (y[:, 51] == -100).all()
    assert ((y != -100).nonzero()[:, 1] >= 8 + 6 + 30).all()
    for i in range(4):
        _distances(x[i], y[i], 4, 64, 8, task.noise_vocab)
    make_task("mqar", seq_len=57, num_kv_pairs=4, vocab_size=64, prefix=40, gap=1).sample(2, "train", 0)
