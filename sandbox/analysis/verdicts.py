"""``sandbox verdict SWEEP_DIR``: a figure's claims judged by the criteria fixed before it ran.

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
"""
from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sandbox.analysis.plot_sweep import finished, load_rows

CEILING = 0.99


@dataclass
class Cell:
    values: list[float]          # one per seed: the best over the other keys (learning rates)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def sd(self) -> float:
        v, m = self.values, self.mean
        return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0

    def text(self) -> str:
        return f"{self.mean:.3f} ± {self.sd:.3f}" if len(self.values) > 1 else f"{self.mean:.3f}"


class Table:
    """A sweep's finished trials, looked up by grid values."""

    def __init__(self, sweep_dir: Path):
        self.dir = Path(sweep_dir)
        rows, _ = load_rows(self.dir)
        self.rows, _ = finished(rows)
        spec = yaml.safe_load((self.dir / "sweep.yaml").read_text())
        self.name = spec["name"]
        self.chance = 2 / spec["base"]["task"]["num_kv_pairs"]

    def best_rows(self, **where) -> dict[int, dict]:
        """Per seed, the finished row matching ``where`` (dotted keys with ``__`` for ``.``) with the highest
        best accuracy, i.e. the best over the other keys (the tuned learning rates)."""
        where = {k.replace("__", "."): v for k, v in where.items()}
        best: dict[int, dict] = {}
        for r in self.rows:
            if all(r.get(k) == v for k, v in where.items()) and r.get("best_accuracy") is not None:
                s = int(r.get("seed") or 0)
                if s not in best or float(r["best_accuracy"]) > float(best[s]["best_accuracy"]):
                    best[s] = r
        return best

    def cell(self, seeds: int, **where) -> Cell | None:
        """The cell of the rows matching ``where``, None unless all of its first ``seeds`` seeds (0 .. seeds-1)
        have a finished trial."""
        best = self.best_rows(**where)
        if not all(s in best for s in range(seeds)):
            return None
        return Cell([float(best[s]["best_accuracy"]) for s in range(seeds)])

    def at_chance(self, c: Cell) -> bool:
        return c.mean < self.chance

    def beats(self, a: Cell, b: Cell, s: float | None = None) -> bool:
        s = max(a.sd, b.sd) if s is None else s
        d = a.mean - b.mean
        return d >= 0.03 and d > 2 * s and not self.at_chance(a)

    def signal(self, a: Cell, b: Cell) -> bool:
        return not (self.at_chance(a) and self.at_chance(b)) and not (a.mean >= CEILING and b.mean >= CEILING)


@dataclass
class Claim:
    name: str
    items: list[tuple[str, str, str | None]] = field(default_factory=list)   # (item, measured, outcome shown)
    outcomes: list = field(default_factory=list)     # what the rule reads per item (None: still open)
    verdicts: set[str] = field(default_factory=set)  # every verdict still possible

    def verdict(self) -> str:
        if len(self.verdicts) == 1:
            return next(iter(self.verdicts))
        return "open: " + " or ".join(sorted(self.verdicts))

    def add(self, item: str, measured: str, outcome, shown: str | None = None) -> None:
        """An item's outcome (None: still open) and how the table shows it (default: the outcome)."""
        self.outcomes.append(outcome)
        self.items.append((item, measured, shown if shown is not None or outcome is None else str(outcome)))

    def missing(self, item: str) -> None:
        """An item whose cells are not all there yet: its outcome stays open."""
        self.add(item, "not yet complete", None)

    def decide(self, choices: tuple, rule) -> None:
        """The verdicts ``rule`` gives over every way the open outcomes could come out (one of ``choices`` each)."""
        self.verdicts = possible(self.outcomes, choices, rule)

    def markdown(self) -> str:
        lines = [f"**{self.name}**: {self.verdict()}", ""]
        lines += [f"- {item}: {measured} -> {outcome or 'open'}" for item, measured, outcome in self.items]
        return "\n".join(lines)


def judge(holds: bool, fails: bool) -> str:
    """A criterion's verdict from its two conditions ("holds" is checked first)."""
    return "holds" if holds else "does not hold" if fails else "inconclusive"


def possible(outcomes: list[str | None], choices: tuple[str, ...], rule) -> set[str]:
    """The verdicts ``rule(outcomes)`` gives over every way the open (None) outcomes could come out."""
    open_ = [i for i, o in enumerate(outcomes) if o is None]
    out = set()
    for fill in itertools.product(choices, repeat=len(open_)):
        full = list(outcomes)
        for i, o in zip(open_, fill):
            full[i] = o
        out.add(rule(full))
    return out


# ---- SSE Figure 8: row-sparse top-k in GLA, MetaLA and GSA ------------------------------------------

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


# ---- SSE Figure 7: state scaling ------------------------------------------------------------------

STEP_OUTCOMES = ("gain", "loss", "neither", "no signal")
VERDICTS = ("holds", "does not hold", "inconclusive")


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


# ---- SSE ablations --------------------------------------------------------------------------------

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


# ---- SLA Figure 2 ---------------------------------------------------------------------------------

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


# ---- Zoology Figure 2 -----------------------------------------------------------------------------

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
        claim.items.append((f"(seq_len, pairs) {size}", ", ".join(f"d{d} {c.mean:.3f}" if c else f"d{d} -"
                                                                  for d, c in zip(ZOO_WIDTHS, cells)), None))

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


# ---- SSE Figures 3, 5 and 9: what the states learned (issue 21, item 6) -----------------------------
# From checkpoints a figure's sweep already trains: per variant and seed, the run of the best learning rate,
# inspected by ``sandbox inspect SWEEP_DIR`` into SWEEP_DIR/state_pictures/<variant>-seed<s>/.

PICTURE_RUNS = {"sse_state_scaling": (
    ("gla", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1})),
    "sse_state_scaling_conv": (          # every row there has conv 4
    ("gla", {"model.mixer": "gla", "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1}))}
PICTURE_SEEDS = 3
# (summary key, the direction the SSE paper predicts for sparse states against dense GLA, label)
STATE_METRICS = (("row_similarity", -1, "lower row similarity (Fig. 3)"),
                 ("sv_entropy", +1, "higher singular-value entropy (Fig. 5)"),
                 ("receptive_field", +1, "larger receptive field (Fig. 9)"))
STATE_MIN_EFFECT = 0.05        # a difference must also reach 5% of dense GLA's mean


def picture_runs(sweep_dir) -> list[tuple[str, int, Path | None]]:
    """(variant, seed, run directory or None while that cell has no finished trial) of a figure's state pictures."""
    t = Table(Path(sweep_dir))
    if t.name not in PICTURE_RUNS:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {t.name!r}, which has no state pictures "
                         f"(known: {', '.join(sorted(PICTURE_RUNS))})")
    out = []
    for variant, where in PICTURE_RUNS[t.name]:
        best = t.best_rows(**where)
        for seed in range(PICTURE_SEEDS):
            row = best.get(seed)
            out.append((variant, seed, t.dir / row["run_dir"] if row and row.get("run_dir") else None))
    return out


def _state_cell(t: Table, variant: str, key: str) -> Cell | None:
    """A variant's metric over its seeds: per run, the mean over the layers that have it."""
    values = []
    for seed in range(PICTURE_SEEDS):
        path = t.dir / "state_pictures" / f"{variant}-seed{seed}" / "summary.json"
        if not path.is_file():
            return None
        layers = json.loads(path.read_text())["layers"].values()
        got = [float(n[key]) for n in layers if n.get(key) is not None and math.isfinite(float(n[key]))]
        if not got:
            return None
        values.append(sum(got) / len(got))
    return Cell(values)


def _state_claim(t: Table, metric: tuple[str, int, str]) -> Claim:
    key, sign, label = metric
    claim = Claim(f"states: sparse states have {label} than dense GLA ({PICTURE_SEEDS} seeds)")
    variants = [v for v, _ in PICTURE_RUNS[t.name]]
    dense = _state_cell(t, variants[0], key)
    for sparse_name in variants[1:]:
        sparse = _state_cell(t, sparse_name, key)
        if dense is None or sparse is None:
            claim.missing(f"{sparse_name} vs {variants[0]}")
            continue
        d = sign * (sparse.mean - dense.mean)
        big = max(2 * max(sparse.sd, dense.sd), STATE_MIN_EFFECT * abs(dense.mean))
        outcome = "as predicted" if d > big else "reversed" if -d > big else "neither"
        claim.add(f"{sparse_name} vs {variants[0]}", f"{sparse.text()} vs {dense.text()}", outcome)

    def rule(o):
        return judge(all(x == "as predicted" for x in o), any(x == "reversed" for x in o))
    claim.decide(("as predicted", "reversed", "neither"), rule)
    return claim



FIGURES = {"sse_fig8_topk": (fig8_pairs, fig8_curves, fig8_conv_off),
           "sse_state_scaling": (scaling_n, scaling_ratio, scaling_full,
                                 *(functools.partial(_state_claim, metric=m) for m in STATE_METRICS)),
           "sse_state_scaling_conv": (scaling_n, scaling_ratio, scaling_full,
                                      *(functools.partial(_state_claim, metric=m) for m in STATE_METRICS)),
           "sse_ablations": (ablation_keys, ablation_shared, ablation_gates),
           "sla_heads": (sla_heads, sla_heads_conv_off),
           "zoology_fig2": (zoo_attention, zoo_width)}


def verdicts(sweep_dir) -> list[Claim]:
    t = Table(Path(sweep_dir))
    if t.name not in FIGURES:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {t.name!r}, which has no criteria here "
                         f"(known: {', '.join(sorted(FIGURES))})")
    return [f(t) for f in FIGURES[t.name]]
