"""SLA Figure 2: SLA's gain over GLA against the number of heads; the criteria of README.md, fixed on 2026-11-27
before the rerun. The effect is a difference of differences of mean test accuracy over seeds, (SLA16 - GLA16) -
(SLA4 - GLA4), with its 95% Welch-Satterthwaite interval."""
from __future__ import annotations

from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Table, greater

STAND_IN = "the paper's Figure 2 measures WikiText perplexity; here MQAR (320, 16) with 192 noise tokens"
MARGIN = 0.05            # the smallest growth of the gain in recall worth reporting
EXPECT = 0.15            # the gain at H = 4 (0.075, say) grown by the paper's factor 2.8 at H = 16, for planning
HEADS = (4, 8, 16)


def _cell(t: Table, mixer: str, heads: int, conv: int = 4) -> Cell | None:
    return t.cell(**{"model.mixer": mixer, f"model.{mixer}.conv_size": conv, "model.n_heads": heads})


def control(t: Table) -> Control:
    return Control("attention, d_model 256", {f"H = {h}": t.cell(**{"model.mixer": "attention", "model.n_heads": h})
                                              for h in HEADS})


def sla_heads(t: Table) -> Claim:
    claim = Claim("SLA's gain over GLA (both with conv 4) grows from 4 to 16 heads", stand_in=STAND_IN)
    claim.contrast("gain(16) - gain(4)", [(+1, _cell(t, "sla", 16)), (-1, _cell(t, "gla", 16)),
                                          (-1, _cell(t, "sla", 4)), (+1, _cell(t, "gla", 4))],
                   greater(MARGIN, EXPECT), ("SLA H16", "GLA H16", "SLA H4", "GLA H4"))
    return claim


CONTROL = control
CLAIMS = (sla_heads,)
