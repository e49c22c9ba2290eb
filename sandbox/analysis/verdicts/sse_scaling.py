"""SSE Figure 7: recall against the partition count n and the active partitions k."""
from __future__ import annotations

import itertools

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
