"""SSE Figure 8: row-sparse top-k against dense in GLA, MetaLA and GSA. The criteria of README.md, fixed before
the run: each effect is a difference of mean test accuracy over seeds with its 95% Welch interval."""
from __future__ import annotations

import itertools

from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Table, greater

MIXERS = ("gla", "metala", "gsa")
SETTINGS = (("zero tokens", {"task.gap": 192, "task.noise": 0}),
            ("noise tokens", {"task.gap": 0, "task.noise": 192}))
MARGIN = 0.05            # the smallest difference in recall worth reporting
EXPECT = 0.3             # the difference the paper's Figure 8 shows at d_model 128, for planning seeds


def _cell(t: Table, mixer: str, setting: dict, d: int, topk: bool) -> Cell | None:
    # model.gsa.topk is the dense/top-k switch of every row: null for dense, 16 for top-k
    return t.cell(**{"model.mixer": mixer, "model.d_model": d, "model.gsa.topk": 16 if topk else None,
                     "model.gla.conv_size": 4, **setting})


def control(t: Table) -> Control:
    return Control("attention with learned positions, d_model 128",
                   {label: t.cell(**{"model.mixer": "attention", "model.positions": "learned", "model.d_model": 128,
                                     **setting}) for label, setting in SETTINGS})


def top_k_improves_recall(t: Table) -> Claim:
    claim = Claim("A: top-k improves recall (d_model 128, conv on)")
    for mixer, (label, setting) in itertools.product(MIXERS, SETTINGS):
        claim.compare(f"{mixer}, {label}", _cell(t, mixer, setting, 128, True), _cell(t, mixer, setting, 128, False),
                      greater(MARGIN, EXPECT), ("top-k", "dense"))
    return claim


def recall_rises_with_width(t: Table) -> Claim:
    claim = Claim("B: with top-k, recall rises with d_model (64 to 256, conv on)")
    for mixer, (label, setting) in itertools.product(MIXERS, SETTINGS):
        claim.compare(f"{mixer}, {label}", _cell(t, mixer, setting, 256, True), _cell(t, mixer, setting, 64, True),
                      greater(MARGIN, EXPECT), ("d256", "d64"))
    return claim


CONTROL = control
CLAIMS = (top_k_improves_recall, recall_rises_with_width)
