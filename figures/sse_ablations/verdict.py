"""SSE ablations: key map, shared parameters, partition gates; the criteria of README.md."""
from __future__ import annotations

from sandbox.analysis.verdicts.claims import VERDICTS, Cell, Claim, Table, judge


def _ablation(t: Table, key_map="softmax", shared=True, gate="write_read") -> Cell | None:
    return t.cell(5, **{"model.sse.key_map": key_map, "model.sse.shared_params": shared, "model.sse.gate": gate})


def _ablation_claim(t: Table, name: str, cells: dict[str, Cell | None], rule) -> Claim:
    claim = Claim(name)
    claim.items = [(n, c.text() if c else "not yet complete", None) for n, c in cells.items()]
    default = _ablation(t)
    if default is not None and t.at_chance(default):
        claim.verdicts = {"inconclusive (the default row at chance)"}
    elif any(c is None for c in cells.values()):
        claim.verdicts = set(VERDICTS)
    else:
        claim.verdicts = {rule(*cells.values())}
    return claim


def ablation_keys(t: Table) -> Claim:
    def rule(soft, silu):
        return judge(t.beats(soft, silu),
                     t.beats(silu, soft) or (abs(soft.mean - silu.mean) < 0.03 and max(soft.sd, silu.sd) < 0.015))
    return _ablation_claim(t, "1: softmax keys beat SiLU (5 seeds)",
                           {"softmax": _ablation(t), "silu": _ablation(t, key_map="silu")}, rule)


def ablation_shared(t: Table) -> Claim:
    def rule(shared, separate):
        s = max(shared.sd, separate.sd)
        return judge(shared.mean >= separate.mean - max(0.03, 2 * s) and s <= 0.05, t.beats(separate, shared))
    return _ablation_claim(t, "2: shared parameters at least as good as separate (5 seeds)",
                           {"shared": _ablation(t), "separate": _ablation(t, shared=False)}, rule)


def ablation_gates(t: Table) -> Claim:
    def rule(wr, read, none, write):
        others = {"read": read, "none": none, "write": write}
        order = sorted(others, key=lambda g: -others[g].mean)
        return judge(wr.mean > max(c.mean for c in others.values()) and t.beats(wr, none) and t.beats(wr, write)
                     and order[0] == "read", any(t.beats(c, wr) for c in others.values()))
    return _ablation_claim(t, "3: write-read gate best, read second (5 seeds)",
                           {g: _ablation(t, gate=g) for g in ("write_read", "read", "none", "write")}, rule)


CLAIMS = (ablation_keys, ablation_shared, ablation_gates)
