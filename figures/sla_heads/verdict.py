"""SLA Figure 2: SLA's gain over GLA against the number of heads; the criteria of README.md."""
from __future__ import annotations

import math

from sandbox.analysis.verdicts.claims import VERDICTS, Claim, Table


SLA_HEADS = (4, 8, 16)


def _sla_gains(t: Table, conv: int, seeds: int, claim: Claim) -> dict:
    """gain(H) = mean(SLA) - mean(GLA) and its s = sqrt(sd_SLA^2 + sd_GLA^2), for the heads whose cells are
    complete; each H is an item of ``claim`` (outcome: the gain, or None while open); also "chance" per H."""
    gains = {}
    for h in SLA_HEADS:
        sla = t.cell(seeds, **{"model.mixer": "sla", "model.sla.conv_size": conv, "model.n_heads": h})
        gla = t.cell(seeds, **{"model.mixer": "gla", "model.gla.conv_size": conv, "model.n_heads": h})
        if sla is None or gla is None:
            claim.missing(f"H = {h}")
            continue
        gains[h] = (sla.mean - gla.mean, math.sqrt(sla.sd ** 2 + gla.sd ** 2), t.at_chance(sla) and t.at_chance(gla))
        claim.add(f"H = {h}", f"SLA {sla.text()}, GLA {gla.text()}", gains[h][0],
                  f"gain {gains[h][0]:+.3f} (s {gains[h][1]:.3f})")
    return gains


def sla_heads(t: Table) -> Claim:
    claim = Claim("SLA's gain over GLA (both with conv 4) grows with the number of heads (5 seeds)")
    gains = _sla_gains(t, 4, 5, claim)
    if len(gains) < 3:
        claim.verdicts = set(VERDICTS)
        return claim
    (g4, s4, c4), (g8, s8, c8), (g16, s16, c16) = (gains[h] for h in SLA_HEADS)
    s = max(s4, s16)
    if c4 and c8 and c16:
        claim.verdicts = {"inconclusive"}
    elif g16 - g4 >= 0.03 and g16 - g4 > 2 * s and not g8 < g4 - 2 * s8:
        claim.verdicts = {"holds"}
    elif g4 - g16 > 2 * s or (abs(g16 - g4) < 0.03 and s < 0.015):
        claim.verdicts = {"does not hold"}
    else:
        claim.verdicts = {"inconclusive"}
    return claim


def sla_heads_conv_off(t: Table) -> Claim:
    """The sign of gain(16) - gain(4) without conv (seed 0) against with it (5 seeds); a sign needs |.| >= 0.03."""
    claim = Claim("robustness: does the sign of gain(16) - gain(4) survive without the convolution (seed 0)")
    with_conv = _sla_gains(t, 4, 5, Claim(""))
    without = _sla_gains(t, 0, 1, claim)
    if len(with_conv) < 3 or len(without) < 3:
        claim.verdicts = {"survives", "changes", "no signal without conv", "inconclusive"}
        return claim
    if all(c for _, _, c in without.values()):
        claim.verdicts = {"no signal without conv"}
        return claim
    sign = {name: 0 if abs(d) < 0.03 else int(math.copysign(1, d))
            for name, d in (("with", with_conv[16][0] - with_conv[4][0]), ("without", without[16][0] - without[4][0]))}
    claim.items.append(("gain(16) - gain(4)", f"{with_conv[16][0] - with_conv[4][0]:+.3f} with conv, "
                        f"{without[16][0] - without[4][0]:+.3f} without", f"signs {sign['with']:+d} / {sign['without']:+d}"))
    if sign["with"] and sign["without"]:
        claim.verdicts = {"survives" if sign["with"] == sign["without"] else "changes"}
    elif not sign["without"]:
        claim.verdicts = {"no signal without conv"}
    else:
        claim.verdicts = {"inconclusive"}
    return claim


CLAIMS = (sla_heads, sla_heads_conv_off)
