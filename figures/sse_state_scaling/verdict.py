"""SSE Figure 7 (recall against the partition count n and the active partitions k) and Figures 3, 5 and 9 (what
the states learned, from the state pictures' summaries): the criteria of README.md, for both runs of the figure
(without conv, ``sse_state_scaling``; with conv 4, ``sse_state_scaling_conv``)."""
from __future__ import annotations

import functools
import itertools
import json
import math

from sandbox.analysis.verdicts.claims import Cell, Claim, Table, judge


STEP_OUTCOMES = ("gain", "loss", "neither", "no signal")


def _sse(t: Table, n: int, k: int, seeds: int = 3, **where) -> Cell | None:
    return t.cell(seeds, **{"model.mixer": "sse", "model.sse.n": n, "model.sse.k": k, **where})


def _no_signal(t: Table, cells: list[Cell | None], claim: Claim) -> bool:
    """The figure's rule: every SSE cell at chance makes each claim inconclusive."""
    if cells and all(c is not None and t.at_chance(c) for c in cells):
        claim.verdicts = {"inconclusive (every SSE cell at chance)"}
        return True
    return False


def _compare(t: Table, big: Cell | None, small: Cell | None) -> str | None:
    if big is None or small is None:
        return None
    if not t.signal(big, small):
        return "no signal"
    return "gain" if t.beats(big, small) else "loss" if t.beats(small, big) else "neither"


SSE_GRID = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8)]


def scaling_n(t: Table) -> Claim:
    claim = Claim("1: at fixed k/n, recall grows with n (3 seeds)")
    for (n0, k0), (n1, k1) in (((2, 1), (4, 2)), ((4, 2), (8, 4)), ((4, 1), (8, 2))):
        small, big = _sse(t, n0, k0), _sse(t, n1, k1)
        o = _compare(t, big, small)
        measured = f"n{n1}k{k1} {big.text()} vs n{n0}k{k0} {small.text()}" if big and small else "not yet complete"
        claim.add(f"({n0},{k0}) -> ({n1},{k1})", measured, o)

    def rule(o):
        return judge(o.count("gain") >= 2 and o.count("loss") == 0,
                     o.count("loss") >= 1 or (o.count("gain") == 0 and sum(x != "no signal" for x in o) >= 2))
    claim.decide(STEP_OUTCOMES, rule)
    _no_signal(t, [_sse(t, n, k) for n, k in SSE_GRID], claim)
    return claim


def scaling_ratio(t: Table) -> Claim:
    claim = Claim("2: at fixed n, gains in k/n saturate near 50% (n = 4 and 8, 3 seeds)")
    for n in (4, 8):
        low, half, full = _sse(t, n, 1), _sse(t, n, n // 2), _sse(t, n, n)
        if low is None or half is None or full is None:
            claim.missing(f"n = {n}")
            continue
        gain = "gain" if t.beats(half, low) else "reversed" if t.beats(low, half) else "neither"
        saturates = not t.beats(full, half)
        claim.add(f"n = {n}", f"k1 {low.text()}, k{n // 2} {half.text()}, k{n} {full.text()}", (gain, saturates),
                  f"k/n 1/2 vs smallest: {gain}; k = n {'does not beat' if saturates else 'beats'} 1/2")

    def rule(o):
        return judge(all(g == "gain" and sat for g, sat in o),
                     any(g == "reversed" for g, _ in o) or not any(sat for _, sat in o))
    claim.decide(tuple(itertools.product(("gain", "reversed", "neither"), (True, False))), rule)
    _no_signal(t, [_sse(t, n, k) for n, k in SSE_GRID], claim)
    return claim


def scaling_full(t: Table) -> Claim:
    """Against dense GLA with the SSE rows' convolution: a file with a conv column (``sse_state_scaling``) gives
    its SSE rows conv 0 there, and one without (``sse_state_scaling_conv``) has one dense GLA row, conv like SSE's."""
    conv = next((r.get("model.gla.conv_size") for r in t.rows if r.get("model.mixer") == "sse"), None)
    claim = Claim(f"3: k = n is like GLA {'without' if conv == 0 else 'with'} conv (3 seeds)")
    gla = t.cell(3, **{"model.mixer": "gla", "model.gla.topk": None,
                       **({} if conv is None else {"model.gla.conv_size": conv})})
    for n in (1, 2, 4, 8):
        c = _sse(t, n, n)
        if c is None or gla is None:
            claim.missing(f"n{n}k{n}")
            continue
        alike = abs(c.mean - gla.mean) < max(0.05, 2 * max(c.sd, gla.sd))
        word = "alike" if alike else "not alike"
        claim.add(f"n{n}k{n}", f"{c.text()} vs GLA {gla.text()}", (word, t.at_chance(c) and t.at_chance(gla)), word)

    def rule(o):
        if all(chance for _, chance in o):
            return "inconclusive"
        alike = sum(a == "alike" for a, _ in o)
        return "holds" if alike >= 3 else "does not hold" if len(o) - alike >= 2 else "inconclusive"
    claim.decide((("alike", False), ("not alike", False), ("alike", True)), rule)
    _no_signal(t, [_sse(t, n, k) for n, k in SSE_GRID], claim)
    return claim


# From checkpoints the sweep already trains: per variant and seed, the run of the best learning rate,
# inspected by ``sandbox inspect SWEEP_DIR`` into SWEEP_DIR/state_pictures/<variant>-seed<s>/.

PICTURE_RUNS = {"sse_state_scaling": (
    ("gla", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1})),
    "sse_state_scaling_conv": (          # every row there has conv 4
    ("gla", {"model.mixer": "gla", "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1}))}
PICTURE_SEEDS = 3
# (summary key, the direction the SSE paper predicts for sparse states against dense GLA, label)
STATE_METRICS = (("row_similarity", -1, "lower row similarity (Fig. 3)"),
                 ("sv_entropy", +1, "higher singular-value entropy (Fig. 5)"),
                 ("receptive_field", +1, "larger receptive field (Fig. 9)"))
STATE_MIN_EFFECT = 0.05        # a difference must also reach 5% of dense GLA's mean


def _state_cell(t: Table, variant: str, key: str) -> Cell | None:
    """A variant's metric over its seeds: per run, the mean over the layers that have it."""
    values = []
    for seed in range(PICTURE_SEEDS):
        path = t.dir / "state_pictures" / f"{variant}-seed{seed}" / "summary.json"
        if not path.is_file():
            return None
        layers = json.loads(path.read_text())["layers"].values()
        got = [float(n[key]) for n in layers if n.get(key) is not None and math.isfinite(float(n[key]))]
        if not got:
            return None
        values.append(sum(got) / len(got))
    return Cell(values)


def state_claim(t: Table, metric: tuple[str, int, str]) -> Claim:
    key, sign, label = metric
    claim = Claim(f"states: sparse states have {label} than dense GLA ({PICTURE_SEEDS} seeds)")
    variants = [v for v, _ in PICTURE_RUNS[t.name]]
    dense = _state_cell(t, variants[0], key)
    for sparse_name in variants[1:]:
        sparse = _state_cell(t, sparse_name, key)
        if dense is None or sparse is None:
            claim.missing(f"{sparse_name} vs {variants[0]}")
            continue
        d = sign * (sparse.mean - dense.mean)
        big = max(2 * max(sparse.sd, dense.sd), STATE_MIN_EFFECT * abs(dense.mean))
        outcome = "as predicted" if d > big else "reversed" if -d > big else "neither"
        claim.add(f"{sparse_name} vs {variants[0]}", f"{sparse.text()} vs {dense.text()}", outcome)

    def rule(o):
        return judge(all(x == "as predicted" for x in o), any(x == "reversed" for x in o))
    claim.decide(("as predicted", "reversed", "neither"), rule)
    return claim


CLAIMS = (scaling_n, scaling_ratio, scaling_full,
          *(functools.partial(state_claim, metric=m) for m in STATE_METRICS))
