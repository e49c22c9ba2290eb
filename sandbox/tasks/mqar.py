"""Multi-query associative recall (MQAR), as in Zoology, plus the gap and noise variants of
the SSE paper's Figure 8 and a variant whose queries sit a set distance behind their pairs.

Layout of one example of length ``T = seq_len`` with ``kv = num_kv_pairs`` and ``P = prefix``::

    [0, P)                     prefix    P noise tokens (none by default)
    [P, P + 2kv)               context   k1 v1 k2 v2 ... (keys in [1, V/2), values in [V/2, V),
                                          all keys distinct, all values distinct)
    [P + 2kv, S)               inserted  G zero tokens (gap=G) or G noise tokens (noise=G),
                                          S = P + 2kv + G
    [S, T)                     queries   each key once, at an even offset 2*s from S; s drawn
                                          without replacement from [0, R//2) (R = T - S) with the
                                          power law p(s) ∝ (s+1)^(a-1); every other position is a filler

Fillers are token 0, except with ``noise`` where every filler of the query region is a noise
token too.

With ``distance=D`` the queries sit between D and D + 4(kv-1) tokens behind their own pair
(``gap`` and ``noise`` must be 0; ``power_a`` is unused)::

    [0, P)                     prefix    P noise tokens
    [P, P + 2kv)               context   as above: pair j (from 0) at P + 2j, the last key at P + 2kv - 2
    [P + 2kv, Q)               stretch   noise tokens, Q = P + 2kv - 2 + D
    [Q, Q + 2kv)               queries   the key of pair j at Q + 2*pi(j), pi a uniform random
                                          permutation (queries in pair order would let attention
                                          find a pair at a fixed offset instead of by its key);
                                          a noise token after each
    [Q + 2kv, T)               tail      noise tokens

So the distance of a query, its position minus its pair's key's, is D + 2(kv-1-j) + 2*pi(j):
exactly D for the last pair queried first, D + 4(kv-1) for the first pair queried last. The
pair's value sits one token less behind the query, so a window of w tokens that counts the query
itself (``swa``'s ``window``) sees every pair's value when D + 4(kv-1) <= w and none when D > w;
a stack of L such layers can relay over L(w-1) tokens. A figure in units of w sets D = G.

Everything outside pairs and queries is a random noise token here, as in a needle-in-a-haystack
test: the stretch is distinct tokens that a cache, a window or a state must hold or drop like
any others, not one repeated token that the filler 0 would make.

The prefix keeps the pairs away from position 0, where an attention sink or NSA's always-kept
first block would hold them whatever the distance: set it at least as long as that block. It is
noise tokens, the haystack's own kind, rather than fillers, so that it reads as more haystack, and
noise tokens cannot be taken for keys or values.

Noise tokens come from their own vocabulary ``[V, V + noise_vocab_size)``, disjoint from keys,
values and 0, so they can never be mistaken for either. The model's vocabulary is therefore
``V + noise_vocab_size`` when ``noise``, ``prefix`` or ``distance`` is on.

The target at a query key's position is the value paired with that key; every other target is
-100. Inputs are the sequence itself (no shift is needed: the answer is predicted at the query
key).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sandbox.tasks.base import SPLIT_IDS, Task, register_task
from sandbox.tasks.rng import bits32, derive, row_key, smallest, uniform


@dataclass
class MQARConfig:
    seq_len: int = 256
    num_kv_pairs: int = 16
    vocab_size: int = 8192
    power_a: float = 0.01
    gap: int = 0
    noise: int = 0
    noise_vocab_size: int | None = None   # default: V // 2
    prefix: int = 0                       # noise tokens before the pairs
    distance: int = 0                     # > 0: the queries' distance behind their pairs (module docstring)
    val_examples: int = 1024
    test_examples: int = 1024
    train_examples: int | None = None     # a fixed training set of this many examples, revisited each epoch

    def __post_init__(self):
        kv, V = self.num_kv_pairs, self.vocab_size
        if kv < 1:
            raise ValueError(f"num_kv_pairs: must be >= 1, got {kv}")
        if V < 4 or V // 2 - 1 < kv:
            raise ValueError(f"vocab_size: {V} leaves {max(V // 2 - 1, 0)} keys, fewer than num_kv_pairs={kv}")
        if V - V // 2 < kv:
            raise ValueError(f"vocab_size: {V} leaves fewer values than num_kv_pairs={kv}")
        if self.gap < 0 or self.noise < 0:
            raise ValueError("gap: gap and noise must be >= 0")
        if self.gap and self.noise:
            raise ValueError("noise: gap and noise are exclusive (gap inserts zeros, noise inserts noise tokens)")
        if self.prefix < 0:
            raise ValueError(f"prefix: must be >= 0, got {self.prefix}")
        if self.distance:
            self._check_distance()
        else:
            need = self.prefix + 4 * kv + self.gap + self.noise
            if self.seq_len < need:
                raise ValueError(f"seq_len: {self.seq_len} is too short for num_kv_pairs={kv} with gap/noise "
                                 f"{self.gap + self.noise} and prefix {self.prefix}: needs at least "
                                 f"prefix + 4*num_kv_pairs + gap + noise = {need}")
        if not 0 < self.power_a <= 1:
            raise ValueError(f"power_a: must be in (0, 1], got {self.power_a}")
        if self.noise_vocab_size is not None and self.noise_vocab_size < 1:
            raise ValueError(f"noise_vocab_size: must be >= 1, got {self.noise_vocab_size}")
        for name in ("val_examples", "test_examples", "train_examples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")

    def _check_distance(self):
        kv, D = self.num_kv_pairs, self.distance
        if D < 2:
            raise ValueError(f"distance: must be 0 (off) or >= 2 (the first query after the last value), got {D}")
        if self.gap or self.noise:
            raise ValueError("distance: excludes gap and noise (the distance sets what lies between pairs and queries)")
        need = self.prefix + 4 * kv - 2 + D
        if self.seq_len < need:
            raise ValueError(f"seq_len: {self.seq_len} is too short for distance={D} with num_kv_pairs={kv} and "
                             f"prefix {self.prefix}: needs at least prefix + 4*num_kv_pairs - 2 + distance = {need}")


@register_task("mqar", MQARConfig)
class MQAR(Task):
    """MQAR (module docstring).

    ``chance`` is 1 / num_kv_pairs: the accuracy of answering each query with one of its context's
    values picked uniformly. That is the best a model can do without binding keys to values: the
    values are drawn independently of the keys, so each of the kv values in the context is equally
    likely to be the answer. Guessing among all V/2 values does worse; recalling even a few pairs
    does better, and that is recall. How far above chance a mean must be to count as learning is
    the verdict's rule to choose, not the task's.
    """

    def __init__(self, cfg: MQARConfig, seed: int = 0, device="cpu"):
        super().__init__(seed, device)
        self.cfg = cfg
        self.seq_len = cfg.seq_len
        self.noise_vocab = (cfg.noise_vocab_size or cfg.vocab_size // 2) if (cfg.noise or cfg.prefix or
                                                                              cfg.distance) else 0
        self.vocab_size = cfg.vocab_size + self.noise_vocab      # what the model must embed
        self.max_targets = cfg.num_kv_pairs                      # scored positions per example
        self.chance = 1 / cfg.num_kv_pairs
        self.split_sizes = {"val": cfg.val_examples, "test": cfg.test_examples}
        self.train_examples = cfg.train_examples
        # rows one generator call should make at most: its largest temporaries are [rows, V/2] float64
        # tables on the CPU (kept near 32 MB each), [rows, seq_len] int64 on a GPU, where the key and value
        # draws need no table (kept near 256 MB: few calls, few launches)
        if self.device.type == "cuda":
            self.rows_per_call = max(1, (1 << 25) // cfg.seq_len)
        else:
            self.rows_per_call = max(1, (1 << 22) // max(cfg.seq_len, cfg.vocab_size // 2))

    def examples(self, ids: torch.Tensor, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Examples for global example ids (int64 [B]) of a split; fully vectorised."""
        c, dev = self.cfg, ids.device
        kv, V, T, P = c.num_kv_pairs, c.vocab_size, c.seq_len, c.prefix
        B = ids.numel()
        n_keys, n_vals = V // 2 - 1, V - V // 2

        base = row_key(ids, self.seed, SPLIT_IDS[split])

        def key(stream):
            return derive(base, stream)

        # distinct keys and values: the kv smallest of n uniforms pick a uniform random subset
        # in random order (52-bit uniforms: no ties in practice, same on every device)
        keys = 1 + smallest(key(11), key(111), n_keys, kv)
        values = V // 2 + smallest(key(12), key(112), n_vals, kv)

        x = torch.zeros(B, T, dtype=torch.int64, device=dev)
        y = torch.full((B, T), -100, dtype=torch.int64, device=dev)
        if self.noise_vocab:
            noise = V + bits32(key(13), torch.arange(T, device=dev)) % self.noise_vocab
            if c.noise or c.distance:
                x = noise                         # every position that is not a pair or a query
            else:
                x[:, :P] = noise[:, :P]           # the prefix alone
        x[:, P:P + 2 * kv:2] = keys
        x[:, P + 1:P + 2 * kv:2] = values

        qpos = self._distance_queries(key) if c.distance else self._power_law_queries(key, dev)
        x.scatter_(1, qpos, keys)
        y.scatter_(1, qpos, values)
        return x, y

    def _power_law_queries(self, key, dev) -> torch.Tensor:
        """Positions [B, kv] of the queries of keys 1 .. kv: power-law slots of the query region."""
        c = self.cfg
        start = c.prefix + 2 * c.num_kv_pairs + c.gap + c.noise
        slots = (c.seq_len - start) // 2
        # without replacement: exponential races E_s / p_s, the smallest kv win
        s = torch.arange(slots, device=dev)
        weight = c.power_a * (s.double() + 1) ** (c.power_a - 1)
        race = -torch.log(uniform(key(14), key(114), s)) / weight
        slot = torch.topk(race, c.num_kv_pairs, dim=1, largest=False).indices          # slot of key j
        return start + 2 * slot

    def _distance_queries(self, key) -> torch.Tensor:
        """Positions [B, kv] of the queries of keys 1 .. kv: a random permutation of the query region's
        even slots, the first slot ``distance`` after the last pair's key."""
        c = self.cfg
        kv = c.num_kv_pairs
        first = c.prefix + 2 * kv - 2 + c.distance
        return first + 2 * smallest(key(14), key(114), kv, kv)
