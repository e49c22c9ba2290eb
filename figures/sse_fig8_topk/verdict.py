"""SSE Figure 8: row-sparse top-k against dense in GLA, MetaLA and GSA; the criteria of README.md."""
from __future__ import annotations

import itertools
import math

from sandbox.analysis.verdicts.claims import CEILING, Cell, Claim, Table, judge


FIG8_MIXERS = ("gla", "metala", "gsa")
FIG8_SETTINGS = (("192 zero tokens", {"task.gap": 192, "task.noise": 0}),
                 ("192 noise tokens", {"task.gap": 0, "task.noise": 192}))
PAIR_OUTCOMES = ("top-k better", "dense better", "neither", "no signal")
CURVE_OUTCOMES = ("rises", "falls", "neither", "no signal")


def _fig8_cell(t: Table, mixer: str, setting: dict, d: int, topk: bool, conv: int, seeds: int) -> Cell | None:
    return t.cell(seeds, **{"model.mixer": mixer, "model.d_model": d, "model.gsa.topk": 16 if topk else None,
                            "model.gla.conv_size": conv, **setting})


def fig8_pairs(t: Table) -> Claim:
    claim = Claim("A: top-k improves recall (six pairs, d_model 128, 3 seeds, conv on)")
    for mixer, (label, setting) in itertools.product(FIG8_MIXERS, FIG8_SETTINGS):
        dense, topk = (_fig8_cell(t, mixer, setting, 128, k, 4, 3) for k in (False, True))
        if dense is None or topk is None:
            outcome, measured = None, "; ".join(f"{n} {c.text() if c else 'not yet complete'}"
                                                for n, c in (("top-k", topk), ("dense", dense)))
        elif t.signal(topk, dense):
            outcome = ("top-k better" if t.beats(topk, dense) else
                       "dense better" if t.beats(dense, topk) else "neither")
            measured = f"top-k {topk.text()} vs dense {dense.text()}"
        else:       # decided at d_model 64 and 256, seed 0
            measured = f"no signal at d128 (top-k {topk.text()}, dense {dense.text()})"
            widths = [(_fig8_cell(t, mixer, setting, d, True, 4, 1), _fig8_cell(t, mixer, setting, d, False, 4, 1))
                      for d in (64, 256)]
            if any(a is None or b is None for a, b in widths):
                outcome = None
            else:
                seen = [(a.mean - b.mean) for a, b in widths if t.signal(a, b)]
                outcome = ("top-k better" if seen and all(x >= 0.10 for x in seen) else
                           "dense better" if any(x <= -0.10 for x in seen) else
                           "neither" if seen else "no signal")
                measured += "; d64, d256: " + ", ".join(f"{a.mean:.3f} vs {b.mean:.3f}" for a, b in widths)
        claim.add(f"{mixer}, {label}", measured, outcome)

    def rule(o):
        better, worse = o.count("top-k better"), o.count("dense better")
        signal = sum(x != "no signal" for x in o)
        return judge(better >= 5 and worse == 0, worse >= 2 or (better <= 2 and signal >= 4))
    claim.decide(PAIR_OUTCOMES, rule)
    return claim


def fig8_curves(t: Table) -> Claim:
    claim = Claim("B: with top-k, recall rises with d_model (six curves, seed 0, conv on)")
    for mixer, (label, setting) in itertools.product(FIG8_MIXERS, FIG8_SETTINGS):
        pts = [_fig8_cell(t, mixer, setting, d, True, 4, 1) for d in (64, 128, 256)]
        ref = _fig8_cell(t, mixer, setting, 128, True, 4, 3)
        if any(p is None for p in pts) or ref is None:
            claim.missing(f"{mixer}, {label}")
            continue
        tol = max(0.03, 2 * ref.sd)
        acc = [p.mean for p in pts]
        if all(a < t.chance for a in acc) or all(a >= CEILING for a in acc):
            outcome = "no signal"
        elif any(b < a - tol for a, b in zip(acc, acc[1:])):
            outcome = "falls"
        elif acc[2] - acc[0] > tol:
            outcome = "rises"
        else:
            outcome = "neither"
        claim.add(f"{mixer}, {label}", " -> ".join(f"{a:.3f}" for a in acc) + f" (t {tol:.3f})", outcome)

    def rule(o):
        return judge(o.count("rises") >= 4 and o.count("falls") == 0, o.count("falls") >= 2)
    claim.decide(CURVE_OUTCOMES, rule)
    return claim


def fig8_conv_off(t: Table) -> Claim:
    claim = Claim("robustness: does the sign of top-k - dense survive without the convolution (d128, seed 0)")
    for mixer, (label, setting) in itertools.product(FIG8_MIXERS, FIG8_SETTINGS):
        pair = {conv: [_fig8_cell(t, mixer, setting, 128, k, conv, 1) for k in (True, False)] for conv in (4, 0)}
        if any(c is None for cs in pair.values() for c in cs):
            claim.missing(f"{mixer}, {label}")
            continue
        s = {conv: (0 if abs(d) < 0.10 else int(math.copysign(1, d)))
             for conv, d in ((conv, a.mean - b.mean) for conv, (a, b) in pair.items())}
        claim.add(f"{mixer}, {label}", f"top-k - dense: {pair[4][0].mean - pair[4][1].mean:+.3f} with conv, "
                  f"{pair[0][0].mean - pair[0][1].mean:+.3f} without", (s[4], s[0]), f"signs {s[4]:+d} / {s[0]:+d}")

    def rule(o):
        both = [(a, b) for a, b in o if a and b]
        if sum(b != 0 for _, b in o) < 3:
            return "no signal without conv"
        if len(both) >= 3 and all(a == b for a, b in both):
            return "survives"
        if sum(a == -b for a, b in both) >= 2:
            return "changes"
        return "inconclusive"
    # one (with conv, without) pair per case the rule tells apart: agree, flip, a sign in one only, in neither
    claim.decide(((1, 1), (1, -1), (0, 1), (1, 0), (0, 0)), rule)
    return claim


CLAIMS = (fig8_pairs, fig8_curves, fig8_conv_off)
