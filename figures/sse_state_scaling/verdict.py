"""SSE Figure 7 (recall against the partition count n and the active partitions k) and Figures 3, 5 and 9 (what
the states learned, from the state pictures' summaries): the criteria of README.md, fixed on 2026-11-27 before the
rerun, for both runs of the figure (without conv, ``sse_state_scaling``; with conv 4, ``sse_state_scaling_conv``).
Each effect is a difference of means over seeds with its 95% Welch interval."""
from __future__ import annotations

import functools
import json
import math

from sandbox.analysis import stats
from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Table, greater, less, within

STAND_IN = "Figure 7 measures recall of 2B language models; here MQAR (256, 32) with 64 noise tokens"
MARGIN = 0.05            # the smallest difference in recall worth reporting
EXPECT = 0.2             # the effect of n or k/n expected on this task, for planning seeds
LEARNED = 0.9            # a state picture counts only from a run that reached this accuracy


def _sse(t: Table, n: int, k: int) -> Cell | None:
    return t.cell(**{"model.mixer": "sse", "model.sse.n": n, "model.sse.k": k})


def control(t: Table) -> Control:
    return Control("attention, d_model 128, 2 heads", {"(256, 32), 64 noise tokens": t.cell(**{"model.mixer":
                                                                                                "attention"})})


def scaling_n(t: Table) -> Claim:
    claim = Claim("1: at fixed k/n, recall grows with n", need=2, stand_in=STAND_IN)
    for (n0, k0), (n1, k1) in (((2, 1), (4, 2)), ((4, 2), (8, 4)), ((4, 1), (8, 2))):
        claim.compare(f"({n0},{k0}) -> ({n1},{k1})", _sse(t, n1, k1), _sse(t, n0, k0), greater(MARGIN, EXPECT),
                      (f"n{n1}k{k1}", f"n{n0}k{k0}"))
    return claim


def scaling_ratio(t: Table) -> Claim:
    claim = Claim("2: at fixed n, gains in k/n saturate near 50% (n = 4 and 8)", stand_in=STAND_IN)
    for n in (4, 8):
        low, half, full = _sse(t, n, 1), _sse(t, n, n // 2), _sse(t, n, n)
        claim.compare(f"n = {n}: k/n 1/2 above k = 1", half, low, greater(MARGIN, EXPECT), (f"k{n // 2}", "k1"))
        claim.compare(f"n = {n}: k = n no better than k/n 1/2", full, half, less(MARGIN), (f"k{n}", f"k{n // 2}"))
    return claim


def scaling_full(t: Table) -> Claim:
    """Against dense GLA with the SSE rows' convolution: a file with a conv column (``sse_state_scaling``) gives
    its SSE rows conv 0 there, and one without (``sse_state_scaling_conv``) has one dense GLA row, conv like SSE's.
    An equivalence holds for two models that learn nothing, so it is judged only where GLA learns."""
    conv = next((r.get("model.gla.conv_size") for r in t.rows if r.get("model.mixer") == "sse"), None)
    claim = Claim(f"3: k = n recalls like GLA {'without' if conv == 0 else 'with'} conv", stand_in=STAND_IN)
    gla = t.cell(**{"model.mixer": "gla", "model.gla.topk": None,
                    **({} if conv is None else {"model.gla.conv_size": conv})})
    reason = None
    if gla is not None and stats.decide(stats.shift(gla.values, t.chance), greater(MARGIN)) != stats.HOLDS:
        reason = f"GLA is not above chance ({t.chance:.3f}) by {MARGIN} with its whole interval"
    for n in (1, 2, 4, 8):
        claim.compare(f"n{n}k{n}", _sse(t, n, n), gla, within(MARGIN), (f"n{n}k{n}", "GLA"), reason)
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
# (summary key, +1 where the paper predicts sparse above dense GLA and -1 below, label, rule on sign x (sparse -
# dense)). Each metric lies in [0, 1]: the receptive field as a share of the tokens before the query.
STATE_METRICS = (("row_similarity", -1, "lower row similarity (Fig. 3)", greater(0.05, 0.2)),
                 ("sv_entropy", +1, "higher singular-value entropy (Fig. 5)", greater(0.02, 0.1)),
                 ("receptive_field", +1, "a larger receptive field (Fig. 9)", greater(0.05, 0.15)))


def _picture(t: Table, variant: str, seed: int) -> tuple[float, float | None] | None:
    """(the accuracy of the inspected model, the run's metric summary) of one picture run, or None where it was
    not inspected. A run trained again for its picture is judged by the retrained model's accuracy."""
    path = t.dir / "state_pictures" / f"{variant}-seed{seed}" / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    again = summary.get("retrained_from")
    if again:
        return float(again["retrained_best_accuracy"]), summary
    cell = t.cell(**dict(PICTURE_RUNS[t.name])[variant])
    if cell is None or seed not in cell.seeds:
        return None
    return cell.values[cell.seeds.index(seed)], summary


def _metric(summary: dict, key: str) -> float | None:
    """A run's metric: the mean over the layers that have it (the receptive field over each layer's cap)."""
    got = []
    for layer in summary["layers"].values():
        v = layer.get(key)
        if v is None or not math.isfinite(float(v)):
            continue
        got.append(float(v) / float(layer["receptive_field_cap"]) if key == "receptive_field" else float(v))
    return sum(got) / len(got) if got else None


def _state_cells(t: Table, variant: str, key: str) -> tuple[Cell | None, Cell | None, str | None]:
    """The metric over the picture runs of ``variant`` that learned (accuracy >= LEARNED), over all those
    inspected, and, where none of those inspected learned, the reason it is not compared."""
    runs = t.cell(**dict(PICTURE_RUNS[t.name])[variant])
    on = runs.selected_on if runs is not None else "test"
    learned, inspected = ([], []), ([], [])
    for seed in range(PICTURE_SEEDS):
        got = _picture(t, variant, seed)
        value = _metric(got[1], key) if got is not None else None
        if value is None:
            continue
        for (seeds, values), take in ((inspected, True), (learned, got[0] >= LEARNED)):
            if take:
                seeds.append(seed)
                values.append(value)
    cell = lambda seeds, values: Cell(values, seeds, on) if values else None     # noqa: E731
    why = f"{variant} learned in 0 of {len(inspected[0])} picture runs" if inspected[0] and not learned[0] else None
    return cell(*learned), cell(*inspected), why


def state_claim(t: Table, metric: tuple) -> Claim:
    """Sparse against dense GLA over the runs that learned; where a side has none, the cells of every inspected
    run are shown and not compared."""
    key, sign, label, rule = metric
    claim = Claim(f"states: sparse states have {label} than dense GLA (runs that learned, >= {LEARNED})")
    variants = [v for v, _ in PICTURE_RUNS[t.name]]
    dense = _state_cells(t, variants[0], key)
    for name in variants[1:]:
        sparse = _state_cells(t, name, key)
        why = "; ".join(w for w in (dense[2], sparse[2]) if w) or None
        d, s = (dense[1], sparse[1]) if why else (dense[0], sparse[0])
        a, b, labels = (s, d, (name, variants[0])) if sign > 0 else (d, s, (variants[0], name))
        claim.compare(f"{name} vs {variants[0]}", a, b, rule, labels, why)
    return claim


CONTROL = control
CLAIMS = (scaling_n, scaling_ratio, scaling_full,
          *(functools.partial(state_claim, metric=m) for m in STATE_METRICS))
