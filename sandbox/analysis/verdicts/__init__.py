"""``sandbox verdict SWEEP_DIR [SWEEP_DIR ...]``: a figure's claims judged by the criteria fixed before it ran (from
one directory, or from its parts' directories pooled).

The criteria are the ones written in ``results/README.md`` before any trial of the figure ran; this
module only computes them, so that a verdict is one command on the committed ``results.csv`` instead
of arithmetic by hand. A claim's outcome is decided from its cells (mean and sample sd over seeds of
each seed's best accuracy over the tuned learning rates). Where cells are still missing (a sweep part
way), every way the missing ones could come out is tried: the verdict is printed when all of them
agree ("settled"), else the possible verdicts.

Terms (``results/README.md``, "Protocol common to all figures"): a mean is at **chance** below
2 / pairs and at the **ceiling** from 0.99; **a beats b** when mean(a) - mean(b) >= 0.03 and > 2 s (s:
the larger sd) and a is not at chance; a comparison has **no signal** when both sides are at chance or
both at the ceiling.

One module per figure (its cells, claims and constants); ``claims.py`` holds the terms they share.
"""
from __future__ import annotations

import functools

from sandbox.analysis.verdicts.claims import Cell, Claim, Table
from sandbox.analysis.verdicts.sla import sla_heads, sla_heads_conv_off
from sandbox.analysis.verdicts.sse_ablations import ablation_gates, ablation_keys, ablation_shared
from sandbox.analysis.verdicts.sse_fig8 import fig8_conv_off, fig8_curves, fig8_pairs
from sandbox.analysis.verdicts.sse_scaling import scaling_full, scaling_n, scaling_ratio
from sandbox.analysis.verdicts.states import PICTURE_RUNS, STATE_METRICS, picture_runs, state_claim
from sandbox.analysis.verdicts.zoology import zoo_attention, zoo_width

__all__ = ["Cell", "Claim", "Table", "PICTURE_RUNS", "FIGURES", "picture_runs", "verdicts"]

_STATES = tuple(functools.partial(state_claim, metric=m) for m in STATE_METRICS)
FIGURES = {"sse_fig8_topk": (fig8_pairs, fig8_curves, fig8_conv_off),
           "sse_state_scaling": (scaling_n, scaling_ratio, scaling_full, *_STATES),
           "sse_state_scaling_conv": (scaling_n, scaling_ratio, scaling_full, *_STATES),
           "sse_ablations": (ablation_keys, ablation_shared, ablation_gates),
           "sla_heads": (sla_heads, sla_heads_conv_off),
           "zoology_fig2": (zoo_attention, zoo_width)}


def verdicts(*sweep_dirs) -> list[Claim]:
    t = Table(*sweep_dirs)
    if t.name not in FIGURES:
        raise ValueError(f"sweep_dir: {t.dir} holds sweep {t.name!r}, which has no criteria here "
                         f"(known: {', '.join(sorted(FIGURES))})")
    return [f(t) for f in FIGURES[t.name]]
