"""The terms every figure's criteria are written in: a cell (mean and sd over seeds of the best
accuracy per seed), the table of a sweep's cells, a claim with its items, and how a claim is decided
while cells are still missing (every way they could come out is tried)."""
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
    """A sweep's finished trials, looked up by grid values. Several directories of one figure (its parts run into
    directories of their own) pool their trials; each row keeps the directory it came from (``sweep_dir``)."""

    def __init__(self, *sweep_dirs: Path):
        dirs = [Path(d) for d in sweep_dirs]
        self.dir = dirs[0]
        self.rows, names = [], {}
        for d in dirs:
            rows, _ = load_rows(d)
            self.rows += [{**r, "sweep_dir": d} for r in finished(rows)[0]]
            if not (d / "sweep.yaml").is_file():
                raise ValueError(f"sweep_dir: {d} has no sweep.yaml (not a sweep directory)")
            names[d] = yaml.safe_load((d / "sweep.yaml").read_text())
        points = [{r["point_id"] for r in self.rows if r["sweep_dir"] == d and r.get("point_id")} for d in dirs]
        shared = set.intersection(*points) if len(points) > 1 else set()
        if shared:          # the best over both would count a repeat as more learning rates
            raise ValueError(f"sweep_dir: the directories share {len(shared)} grid point(s): they are repeats of "
                             f"one another, not parts of one figure; judge each alone")
        if len({n["name"] for n in names.values()}) > 1:
            raise ValueError("sweep_dir: the directories hold different sweeps ("
                             + ", ".join(f"{d}: {n['name']}" for d, n in names.items()) + "); pool only one figure's parts")
        spec = names[self.dir]
        self.name = spec["name"]
        self.chance = chance_level(spec["base"]["task"])

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


def chance_level(task: dict) -> float:
    """The mean accuracy below which a cell of a sweep on ``task`` (its base task's settings) is at chance: twice
    the rate of guessing among the pairs' values (MQAR)."""
    return 2 / task["num_kv_pairs"]


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


VERDICTS = ("holds", "does not hold", "inconclusive")
