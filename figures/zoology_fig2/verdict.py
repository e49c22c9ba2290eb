"""Zoology Figure 2: attention solves MQAR; fixed-state models need width for longer sequences. The criteria
of README.md."""
from __future__ import annotations

from sandbox.analysis.verdicts.claims import Cell, Claim, Table, judge


ZOO_SIZES = ((64, 4), (128, 8), (256, 16), (512, 64))
ZOO_WIDTHS = (64, 128, 256)


def _zoo(t: Table, mixer: str, d: int, size, topk: bool = False) -> Cell | None:
    seq, pairs = size
    where = {"model.mixer": mixer, "model.d_model": d, "task.seq_len": seq, "task.num_kv_pairs": pairs}
    if mixer == "gla":
        where.update({"model.gla.topk": d // 8 if topk else None, "model.gla.conv_size": 4})
    return t.cell(1, **where)


def zoo_attention(t: Table) -> Claim:
    claim = Claim("1: attention solves every size at every width (one seed)")
    accs = []
    for size in ZOO_SIZES:
        cells = [_zoo(t, "attention", d, size) for d in ZOO_WIDTHS]
        accs += [c.mean if c else None for c in cells]
        counts = (f"{sum(c.mean >= 0.95 for c in cells)} of 3 at >= 0.95, {sum(c.mean < 0.9 for c in cells)} "
                  f"below 0.9" if all(cells) else None)                  # what the rule reads, once all are in
        claim.items.append((f"(seq_len, pairs) {size}", ", ".join(f"d{d} {c.mean:.3f}" if c else f"d{d} -"
                                                                  for d, c in zip(ZOO_WIDTHS, cells)), counts))

    def rule(high, low):        # points at >= 0.95, points below 0.9 (of 12)
        return judge(high >= 11 and low == 0, low >= 2)
    known = [a for a in accs if a is not None]
    high, low, m = sum(a >= 0.95 for a in known), sum(a < 0.9 for a in known), len(accs) - len(known)
    claim.verdicts = {rule(high + h, low + lo) for h in range(m + 1) for lo in range(m + 1 - h)}
    return claim


def zoo_width(t: Table) -> Claim:
    claim = Claim("2: fixed-state models need more width as the task grows (one seed)")
    for label, mixer, topk in (("GLA", "gla", False), ("GLA top-k", "gla", True), ("SSE n4k1", "sse", False),
                               ("Gated DeltaNet", "gated_deltanet", False)):
        cells = {(size, d): _zoo(t, mixer, d, size, topk) for size in ZOO_SIZES for d in ZOO_WIDTHS}
        if any(c is None for c in cells.values()):
            claim.missing(label)
            continue
        w = [next((d for d in ZOO_WIDTHS if cells[(size, d)].mean >= 0.9), 512) for size in ZOO_SIZES]
        if all(x == 512 for x in w):
            o = "no signal"
        elif all(b >= a for a, b in zip(w, w[1:])) and w[-1] > w[0]:
            o = "needs width"
        elif all(x == 64 for x in w):
            o = "needs none"
        else:
            o = "neither"
        claim.add(label, "w = " + ", ".join(str(x) if x <= 256 else ">256" for x in w), o)

    def rule(o):
        return judge(o.count("needs width") >= 3, o.count("needs none") >= 2)
    claim.decide(("needs width", "needs none", "neither", "no signal"), rule)
    return claim


CLAIMS = (zoo_attention, zoo_width)
