"""Zoology Figure 2: attention solves MQAR; fixed-state models need width for longer sequences. The criteria of
README.md, fixed before the run."""
from __future__ import annotations

from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Table, greater

SIZES = ((64, 4), (128, 8), (256, 16), (512, 64))
WIDTHS = (64, 128, 256)
MARGIN = 0.05            # the smallest difference in recall worth reporting
EXPECT = 0.5             # the width effect Zoology's Figure 2 shows for gated convolutions at (512, 64), for planning
FIXED_STATE = (("GLA", "gla", False), ("GLA top-k", "gla", True), ("SSE n4k1", "sse", False),
               ("Gated DeltaNet", "gated_deltanet", False))


def _cell(t: Table, mixer: str, d: int, size, topk: bool = False) -> Cell | None:
    seq, pairs = size
    where = {"model.mixer": mixer, "model.d_model": d, "task.seq_len": seq, "task.num_kv_pairs": pairs}
    if mixer == "gla":
        where.update({"model.gla.topk": d // 8 if topk else None, "model.gla.conv_size": 4})
    return t.cell(**where)


def control(t: Table) -> Control:
    """Claim 1 of the paper is the figure's positive control: attention at every size and width."""
    return Control("attention (claim 1: attention solves every size at every width)",
                   {f"({s}, {p}) d{d}": _cell(t, "attention", d, (s, p)) for s, p in SIZES for d in WIDTHS})


def width_needed(t: Table) -> Claim:
    """At the largest size, the widest model recalls more than the narrowest, for most fixed-state models."""
    claim = Claim("2: fixed-state models need more width as the task grows (at (512, 64): d256 above d64)", need=3)
    for label, mixer, topk in FIXED_STATE:
        claim.compare(label, _cell(t, mixer, 256, SIZES[-1], topk), _cell(t, mixer, 64, SIZES[-1], topk),
                      greater(MARGIN, EXPECT), ("d256", "d64"))
    return claim


def small_task_needs_no_width(t: Table) -> Claim:
    """The other half of "needs more width as the task grows": at the smallest size the narrowest model suffices."""
    claim = Claim("2b: at (64, 4) the narrowest fixed-state model is within 0.05 of the widest", need=3)
    for label, mixer, topk in FIXED_STATE:
        claim.compare(label, _cell(t, mixer, 64, SIZES[0], topk), _cell(t, mixer, 256, SIZES[0], topk),
                      greater(-MARGIN, 0.0), ("d64", "d256"))
    return claim


CONTROL = control
CLAIMS = (width_needed, small_task_needs_no_width)
