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

import itertools
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

    def cell(self, seeds: int, **where) -> Cell | None:
        """The cell of the rows matching ``where`` (dotted keys with ``__`` for ``.``), None unless all of
        its first ``seeds`` seeds (0 .. seeds-1) have a finished trial."""
        where = {k.replace("__", "."): v for k, v in where.items()}
        best: dict[int, float] = {}
        for r in self.rows:
            if all(r.get(k) == v for k, v in where.items()) and r.get("best_accuracy") is not None:
                s = int(r.get("seed") or 0)
                best[s] = max(best.get(s, -1.0), float(r["best_accuracy"]))
        if not all(s in best for s in range(seeds)):
            return None
        return Cell([best[s] for s in range(seeds)])

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
    items: list[tuple[str, str, str | None]] = field(default_factory=list)   # (item, measured, outcome)
    verdicts: set[str] = field(default_factory=set)                          # every verdict still possible

    def verdict(self) -> str:
        if len(self.verdicts) == 1:
            return next(iter(self.verdicts))
        return "open: " + " or ".join(sorted(self.verdicts))

    def markdown(self) -> str:
        lines = [f"**{self.name}**: {self.verdict()}", ""]
        lines += [f"- {item}: {measured} -> {outcome or 'open'}" for item, measured, outcome in self.items]
        return "\n".join(lines)


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
    outcomes = []
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
        outcomes.append(outcome)
        claim.items.append((f"{mixer}, {label}", measured, outcome))

    def rule(o):
        better, worse = o.count("top-k better"), o.count("dense better")
        signal = sum(x != "no signal" for x in o)
        if better >= 5 and worse == 0:
            return "holds"
        if worse >= 2 or (better <= 2 and signal >= 4):
            return "does not hold"
        return "inconclusive"
    claim.verdicts = possible(outcomes, PAIR_OUTCOMES, rule)
    return claim


def fig8_curves(t: Table) -> Claim:
    claim = Claim("B: with top-k, recall rises with d_model (six curves, seed 0, conv on)")
    outcomes = []
    for mixer, (label, setting) in itertools.product(FIG8_MIXERS, FIG8_SETTINGS):
        pts = [_fig8_cell(t, mixer, setting, d, True, 4, 1) for d in (64, 128, 256)]
        ref = _fig8_cell(t, mixer, setting, 128, True, 4, 3)
        if any(p is None for p in pts) or ref is None:
            outcomes.append(None)
            claim.items.append((f"{mixer}, {label}", "not yet complete", None))
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
        outcomes.append(outcome)
        claim.items.append((f"{mixer}, {label}", " -> ".join(f"{a:.3f}" for a in acc) + f" (t {tol:.3f})", outcome))

    def rule(o):
        if o.count("rises") >= 4 and o.count("falls") == 0:
            return "holds"
        if o.count("falls") >= 2:
            return "does not hold"
        return "inconclusive"
    claim.verdicts = possible(outcomes, CURVE_OUTCOMES, rule)
    return claim


def fig8_conv_off(t: Table) -> Claim:
    claim = Claim("robustness: does the sign of top-k - dense survive without the convolution (d128, seed 0)")
    signs = []
    for mixer, (label, setting) in itertools.product(FIG8_MIXERS, FIG8_SETTINGS):
        pair = {conv: [_fig8_cell(t, mixer, setting, 128, k, conv, 1) for k in (True, False)] for conv in (4, 0)}
        if any(c is None for cs in pair.values() for c in cs):
            signs.append(None)
            claim.items.append((f"{mixer}, {label}", "not yet complete", None))
            continue
        s = {conv: (0 if abs(d) < 0.10 else int(math.copysign(1, d)))
             for conv, d in ((conv, a.mean - b.mean) for conv, (a, b) in pair.items())}
        signs.append((s[4], s[0]))
        claim.items.append((f"{mixer}, {label}", f"top-k - dense: {pair[4][0].mean - pair[4][1].mean:+.3f} with conv, "
                            f"{pair[0][0].mean - pair[0][1].mean:+.3f} without", f"signs {s[4]:+d} / {s[0]:+d}"))

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
    claim.verdicts = possible(signs, ((1, 1), (1, -1), (0, 1), (1, 0), (0, 0)), rule)
    return claim


FIGURES = {"sse_fig8_topk": (fig8_pairs, fig8_curves, fig8_conv_off)}


def verdicts(sweep_dir) -> list[Claim]:
    t = Table(Path(sweep_dir))
    if t.name not in FIGURES:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {t.name!r}, which has no criteria here "
                         f"(known: {', '.join(sorted(FIGURES))})")
    return [f(t) for f in FIGURES[t.name]]
