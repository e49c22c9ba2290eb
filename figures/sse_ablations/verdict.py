"""SSE ablations: key map, shared parameters, partition gates; the criteria of README.md, fixed on 2026-11-27
before the rerun. Each effect is a difference of mean test accuracy over seeds with its 95% Welch interval."""
from __future__ import annotations

from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Table, greater

STAND_IN = ("the paper's ablations measure Recall-Avg of 600M and 2B language models; here MQAR (256, 32) with 64 "
            "noise tokens")
MARGIN = 0.05            # the smallest difference in recall worth reporting
GATE_MARGIN = 0.02       # the paper's gate gaps are 4.7-10% of its recall: 0.04-0.09 at an accuracy of 0.9
# Expected effects, for planning seeds: the paper's relative gap applied to an accuracy of 0.9.
EXPECT = {"keys": 0.2, "shared": 0.15, "read": 0.04, "none": 0.08, "write": 0.09}


def _ablation(t: Table, key_map="softmax", shared=True, gate="write_read") -> Cell | None:
    return t.cell(**{"model.mixer": "sse", "model.sse.key_map": key_map, "model.sse.shared_params": shared,
                     "model.sse.gate": gate})


def control(t: Table) -> Control:
    return Control("attention, d_model 128, 2 heads", {"(256, 32), 64 noise tokens": t.cell(**{"model.mixer":
                                                                                                "attention"})})


def ablation_keys(t: Table) -> Claim:
    claim = Claim("1: softmax keys beat SiLU keys", stand_in=STAND_IN)
    claim.compare("softmax - silu", _ablation(t), _ablation(t, key_map="silu"), greater(MARGIN, EXPECT["keys"]),
                  ("softmax", "silu"))
    return claim


def ablation_shared(t: Table) -> Claim:
    """Non-inferiority: shared parameters lose less than the margin against separate ones (half the parameters)."""
    claim = Claim("2: shared parameters at least as good as separate ones", stand_in=STAND_IN)
    claim.compare("shared - separate", _ablation(t), _ablation(t, shared=False), greater(-MARGIN, EXPECT["shared"]),
                  ("shared", "separate"))
    return claim


def ablation_gates(t: Table) -> Claim:
    claim = Claim("3: the write-read gate is best", stand_in=STAND_IN)
    for gate in ("read", "none", "write"):
        claim.compare(f"write_read - {gate}", _ablation(t), _ablation(t, gate=gate), greater(GATE_MARGIN, EXPECT[gate]),
                      ("write_read", gate))
    return claim


CONTROL = control
CLAIMS = (ablation_keys, ablation_shared, ablation_gates)
