"""The terms a figure's claims are written in: cells of a sweep, comparisons with a rule, claims that combine them.

A figure's ``verdict.py`` builds its claims from a ``Table`` (the finished trials of its sweep directories):

    claim = Claim("A: top-k improves recall")                    # every item must hold (``need``: a count)
    claim.compare("gla, zero tokens", t.cell(**topk), t.cell(**dense), greater(0.05, expect=0.3))
    claim.against("gsa, zero tokens", t.cell(**gsa), t.chance, less(0.05))     # a cell against a fixed level
    claim.contrast("gain(16) - gain(4)", [(+1, sla16), (-1, gla16), (-1, sla4), (+1, gla4)], greater(0.05),
                   ("SLA H16", "GLA H16", "SLA H4", "GLA H4"))                # a difference of differences

and its positive control from the same table: ``Control("attention", {point: t.cell(**attn), ...})``, which must
reach ``CONTROL_LEVEL`` at every point before any claim means anything.

A **cell** holds one value per seed: the test accuracy of the trial whose learning rate and step were chosen on
the validation split (a run from before the split: its best test accuracy over learning rates and steps, and the
cell says so). A **comparison** is an effect with its 95% interval and a rule fixed before running
(``sandbox.analysis.stats``); a claim combines its comparisons with Holm's adjustment and reads "holds", "does not
hold" or "inconclusive", the last with the seeds per cell that would decide it. Missing cells count as
inconclusive, so a sweep part way through already shows what is settled, and so does a comparison the figure does
not make for a reason it prints (``reason``: a side that never learned, where an equivalence would hold by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sandbox.analysis import stats
from sandbox.analysis.plot_sweep import finished, load_rows, number
from sandbox.analysis.stats import FAILS, HOLDS, OPEN, Effect, Rule, greater, less, within
from sandbox.config import flatten

__all__ = ["Cell", "Table", "Item", "Contrast", "Claim", "Control", "greater", "less", "within", "HOLDS", "FAILS",
           "OPEN", "CONTROL_LEVEL", "FOOTNOTE"]

CONTROL_LEVEL = 0.99


@dataclass
class Cell:
    """One value per seed (``values[i]`` of ``seeds[i]``), how the learning rate and step were chosen, and what a
    seed of it cost: the GPU-seconds of its finished trials (every learning rate), each trial's wall time over the
    replicas it was stacked with (None: its runs recorded no times)."""
    values: list[float]
    seeds: list[int]
    selected_on: str = "val"      # "val", or "test" for runs that predate the validation split
    gpu_s_per_seed: float | None = None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def sd(self) -> float:
        return stats._sd(self.values)

    def text(self) -> str:
        mark = "" if self.selected_on == "val" else "*"
        if self.n < 2:
            return f"{self.mean:.3f}{mark}"
        _, lo, hi = stats.mean_ci(self.values, bounds=(0.0, 1.0))
        return f"{self.mean:.3f} [{lo:.3f}, {hi:.3f}]{mark}"


class Table:
    """A figure's finished trials, looked up by grid values. Several directories (a figure's parts, or reruns of
    one protocol with new seeds) pool their trials; a seed found in two directories keeps the first one's."""

    def __init__(self, *sweep_dirs):
        dirs = [Path(d) for d in sweep_dirs]
        if not dirs:
            raise ValueError("sweep_dir: give at least one sweep directory")
        self.dir, self.rows, specs = dirs[0], [], {}
        for d in dirs:
            if not (d / "sweep.yaml").is_file():
                raise ValueError(f"sweep_dir: {d} has no sweep.yaml (not a sweep directory)")
            specs[d] = yaml.safe_load((d / "sweep.yaml").read_text())
            rows, _ = load_rows(d)
            self.rows += [{**r, "sweep_dir": d} for r in finished(rows)[0]]
        names = {s["name"] for s in specs.values()}
        if len(names) > 1:
            raise ValueError("sweep_dir: the directories hold different sweeps (" + ", ".join(sorted(names))
                             + "); pool only one figure's parts and reruns")
        self.spec = specs[self.dir]
        self.base = flatten(self.spec.get("base") or {})
        self.name = self.spec["name"]
        self.chance = chance_level(self.spec["base"]["task"])
        self.notes: list[str] = []

    def rows_where(self, **where) -> list[dict]:
        """Finished rows matching ``where`` (dotted keys, ``__`` for ``.`` where a keyword needs it). A key the
        results have no column for is one the grid does not vary: every row has the base's value."""
        where = {k.replace("__", "."): v for k, v in where.items()}
        return [r for r in self.rows
                if all((r[k] if k in r else self.base.get(k)) == v for k, v in where.items())]

    def best_rows(self, **where) -> dict[int, dict]:
        """Per seed, the chosen row (see ``cell``) among those matching ``where``."""
        chosen: dict[int, dict] = {}
        for r in self.rows_where(**where):
            pick, value, _ = selection(r)
            if pick is None or value is None:
                continue
            s = int(r.get("seed") or 0)
            old = chosen.get(s)
            if old is not None and old["sweep_dir"] != r["sweep_dir"]:
                continue                               # the same seed in a later directory: the first one's counts
            if old is None or pick > selection(old)[0]:
                chosen[s] = r
        return chosen

    def cell(self, **where) -> Cell | None:
        """The cell of the rows matching ``where``: per seed, the trial (of the tuned learning rates) with the best
        validation accuracy, read at its test accuracy at the step chosen on validation. None when no seed has
        finished."""
        chosen = self.best_rows(**where)
        if not chosen:
            return None
        seeds = sorted(chosen)
        picks = [selection(chosen[s]) for s in seeds]
        on = "val" if all(p[2] == "val" for p in picks) else "test"
        return Cell([p[1] for p in picks], seeds, on, _gpu_s_per_seed(self.rows_where(**where)))


def holm_level(m: int) -> str:
    """The interval an item must clear to decide first among ``m`` under Holm's adjustment: 1 - 0.05 / m."""
    return f"{100 * (1 - (1 - stats.LEVEL) / m):.1f}%"


def _gpu_s_per_seed(rows: list[dict]) -> float | None:
    """The GPU-seconds the (finished) rows' trials took per seed: each trial's wall time over its stack's replicas
    (they shared one GPU for that time), summed, over the seeds they ran. None where no trial recorded its time."""
    spent = [(number(r.get("wall_time_s")), number(r.get("replicas")) or 1.0) for r in rows]
    spent = [wall / max(1.0, replicas) for wall, replicas in spent if wall is not None]
    if not spent:
        return None
    return sum(spent) / len({int(r.get("seed") or 0) for r in rows})


def selection(row: dict) -> tuple[float | None, float | None, str]:
    """(what a trial is chosen by, the value it contributes, the split it was chosen on)."""
    val = number(row.get("best_val_accuracy"))
    if val is not None:
        return val, number(row.get("test_at_best_val")), "val"
    best = number(row.get("best_accuracy"))
    return best, best, "test"


def chance_level(task: dict) -> float:
    """The task's own chance level (the task contract's ``chance``) from a sweep base's ``task`` section."""
    from sandbox.tasks import make_task
    if "name" not in task:
        raise ValueError("sweep.yaml: base.task has no name (the task whose chance level the claims read)")
    return float(make_task(task["name"], **{k: v for k, v in task.items() if k != "name"}).chance)


@dataclass
class Item:
    """One comparison of a claim. ``reason``, when set, says why it is not made (e.g. a side that never learned the
    task, where an equivalence would hold for no reason): it then counts as inconclusive, as a missing cell does."""
    name: str
    a: Cell | None
    b: Cell | float | None          # a cell, or a fixed level (chance, a ceiling)
    rule: Rule
    labels: tuple[str, str] = ("a", "b")
    reason: str | None = None

    @property
    def effect(self) -> Effect | None:
        if self.a is None or self.b is None or self.reason:
            return None
        if isinstance(self.b, Cell):
            return stats.difference(self.a.values, self.b.values)
        return stats.shift(self.a.values, float(self.b))

    def sds(self) -> list[float]:
        cells = [c for c in (self.a, self.b) if isinstance(c, Cell) or c is None]
        return [c.sd if c is not None and c.n > 1 else math.nan for c in cells]

    def columns(self) -> tuple[str, str]:
        """The table's a and b columns."""
        a = f"{self.labels[0]} {self.a.text()}" if self.a else f"{self.labels[0]} not run"
        b = (f"{self.labels[1]} {self.b.text()}" if isinstance(self.b, Cell) else
             self.labels[1] if self.b is not None else f"{self.labels[1]} not run")
        return a, b

    def cells(self) -> list[Cell]:
        return [c for c in (self.a, self.b) if isinstance(c, Cell)]

    def same_seed_by_seed(self) -> bool:
        """Both sides are cells of two or more seeds with equal values per seed, not all of them solved (>= 0.99) or
        0: two models rarely agree so to the last digit, one model trained twice with the same seed and arithmetic
        does."""
        a, b = self.a, self.b
        if not (isinstance(a, Cell) and isinstance(b, Cell)) or a.n < 2 or sorted(a.seeds) != sorted(b.seeds):
            return False
        same = dict(zip(a.seeds, a.values)) == dict(zip(b.seeds, b.values))
        return same and any(0 < v < 0.99 for v in a.values)

    def bounds(self) -> tuple[float, float]:
        """The range the effect can take (a difference of accuracies lies in [-1, 1])."""
        return (-1.0, 1.0) if isinstance(self.b, Cell) else (-math.inf, math.inf)


@dataclass
class Contrast:
    """A signed sum of cells' means as one comparison, e.g. a difference of differences: (SLA16 - GLA16) -
    (SLA4 - GLA4) is ``terms`` [(+1, SLA16), (-1, GLA16), (-1, SLA4), (+1, GLA4)]."""
    name: str
    terms: list[tuple[int, Cell | None]]
    rule: Rule
    labels: tuple[str, ...]
    reason: str | None = None

    @property
    def effect(self) -> Effect | None:
        if self.reason or any(c is None for _, c in self.terms):
            return None
        return stats.contrast([(s, c.values) for s, c in self.terms])

    def sds(self) -> list[float]:
        return [c.sd if c is not None and c.n > 1 else math.nan for _, c in self.terms]

    def columns(self) -> tuple[str, str]:
        """The cells added (a) and the cells subtracted (b)."""
        def side(sign):
            return "; ".join(f"{label} {c.text() if c else 'not run'}"
                             for (s, c), label in zip(self.terms, self.labels) if s == sign)
        return side(1), side(-1)

    def cells(self) -> list[Cell]:
        return [c for _, c in self.terms if c is not None]

    def bounds(self) -> tuple[float, float]:
        signs = [s for s, _ in self.terms]
        return float(-signs.count(-1)), float(signs.count(1))


@dataclass
class Claim:
    """Named comparisons and how they combine: every item must hold (``need`` None) or at least ``need`` of them.
    ``stand_in`` names what a synthetic task stands in for (a language-model claim tested on MQAR)."""
    name: str
    need: int | None = None
    stand_in: str | None = None
    items: list[Item | Contrast] = field(default_factory=list)

    def compare(self, name: str, a: Cell | None, b: Cell | None, rule: Rule, labels=("a", "b"),
                reason: str | None = None) -> None:
        self.items.append(Item(name, a, b, rule, labels, reason))

    def against(self, name: str, a: Cell | None, level: float, rule: Rule, label: str = "a") -> None:
        self.items.append(Item(name, a, level, rule, (label, f"{level:g}")))

    def contrast(self, name: str, terms: list[tuple[int, Cell | None]], rule: Rule, labels: tuple[str, ...],
                 reason: str | None = None) -> None:
        self.items.append(Contrast(name, list(terms), rule, tuple(labels), reason))

    def judged(self) -> tuple[str, list[str]]:
        effects = [i.effect for i in self.items]
        return stats.combine(effects, [i.rule for i in self.items], self.need)

    def verdict(self) -> str:
        return self.judged()[0]

    def rule_text(self) -> str:
        m = len(self.items)
        rules = sorted({i.rule.text() for i in self.items})
        every = self.need in (None, m)
        how = ("its item holds" if m == 1 else f"every one of the {m} items holds" if every else
               f"at least {self.need} of the {m} items hold")
        fails = "it does" if m == 1 else "any item does" if every else f"more than {m - self.need} do"
        return (f"each item's effect must satisfy {' / '.join(rules)} with its whole 95% interval"
                + (f" (Holm over the {m} items: the first item to decide needs its {holm_level(m)} interval clear, "
                   "the last its 95%)" if m > 1 else "") + f"; the claim holds when {how}, and does "
                f"not hold once {fails} not")

    def markdown(self) -> str:
        verdict, outcomes = self.judged()
        missing = sum(1 for i in self.items if i.effect is None and not i.reason)
        if verdict == OPEN and missing:         # the rows it needs have not run: not a result that could not decide
            verdict += f": {missing} of {len(self.items)} item{'s' if len(self.items) > 1 else ''} not run yet"
        lines = [f"**{self.name}**: {verdict}" + (f" (a stand-in: {self.stand_in})" if self.stand_in else ""), "",
                 f"Rule: {self.rule_text()}.", "",
                 "| item | a | b | n | effect [95% interval] | P(a > b) | verdict |", "|---|---|---|---|---|---|---|"]
        undecided = []
        for item, outcome in zip(self.items, outcomes):
            e = item.effect
            a, b = item.columns()
            if e is None:
                why = f"not compared: {item.reason}" if item.reason else "not run"
                lines.append(f"| {item.name} | {a} | {b} | - | - | - | {why} |")
                continue
            sup = f"{e.p_superior:.2f}" if e.p_superior is not None else "-"
            lines.append(f"| {item.name} | {a} | {b} | {stats.n_text(e)} | {stats.effect_text(e, item.bounds())} "
                         f"| {sup} | {outcome} |")
            if outcome == OPEN:
                undecided.append(f"{item.name}: {stats.seeds_text(e, item.rule, len(self.items))}"
                                 + _cost_text(item.cells(), stats.seeds_to_decide(e, item.rule, len(self.items)))
                                 + self._deciding(outcomes))
        if undecided:
            lines += ["", "Inconclusive: " + "; ".join(undecided) + "."]
        twins = [i.name for i in self.items if isinstance(i, Item) and i.same_seed_by_seed()]
        if twins:
            lines += ["", f"Check: {', '.join(twins)}: both sides gave the same accuracy seed by seed, as one model "
                          "trained twice does; two settings that should differ may compute the same thing."]
        return "\n".join(lines)

    def _deciding(self, outcomes: list[str]) -> str:
        """What deciding this item would do to an undecided claim. Where one more "does not hold" (or "holds")
        settles it, this item's seeds are the ones worth running first."""
        m = len(self.items)
        need = m if self.need is None else self.need
        fails = outcomes.count(FAILS) + 1 > m - need
        holds = outcomes.count(HOLDS) + 1 >= need
        if m == 1 or stats.claim_verdict(outcomes, need) != OPEN or not (fails or holds):
            return ""
        if fails and holds:
            return " (the claim goes as this item goes)"
        return " (if this item does not hold, neither does the claim)" if fails else " (if it holds, so does the claim)"

    def plan(self, power: float = 0.8) -> list[tuple[str, Rule, list[float], int | None]]:
        """Per item: (name, rule, the pilot's sds (NaN: unknown), seeds per cell for ``power``)."""
        return [(i.name, i.rule, i.sds(), stats.seeds_for_power(i.sds(), i.rule, power, len(self.items)))
                for i in self.items]

    def plan_markdown(self, power: float = 0.8) -> str:
        lines = [f"**{self.name}**", "", f"| item | rule | expected effect | pilot sd | seeds per cell ({power:.0%} "
                 "power) | GPU-minutes |", "|---|---|---|---|---|---|"]
        for item, (name, rule, sds, n) in zip(self.items, self.plan(power)):
            sd = " / ".join("unknown" if not s == s else f"{s:.3f}" for s in sds)
            rule_cell = rule.text().replace("|", "\\|")          # an equivalence's |effect| inside a table
            seeds = n if n is not None else f"more than {stats.MAX_SEEDS}, or the expected effect cannot hold"
            lines.append(f"| {name} | {rule_cell} | {rule.planned_effect():+.2f} | {sd} | {seeds} "
                         f"| {_plan_cost(item.cells(), n)} |")
        return "\n".join(lines)


def _plan_cost(cells: list[Cell], seeds: int | None) -> str:
    """What a run of ``seeds`` per cell would take, at the pilot cells' GPU-seconds per seed ("-": unknown)."""
    if seeds is None or not cells or any(c.gpu_s_per_seed is None for c in cells):
        return "-"
    return f"{seeds * sum(c.gpu_s_per_seed for c in cells) / 60:.0f}"


def _cost_text(cells: list[Cell], seeds: int | None) -> str:
    """What the seeds that would decide a comparison cost more, at its cells' measured GPU-seconds per seed."""
    if seeds is None or any(c.gpu_s_per_seed is None for c in cells):
        return ""
    more = sum(max(0, seeds - c.n) * c.gpu_s_per_seed for c in cells)
    return f", about {more / 60:.0f} GPU-minutes more at its cells' measured cost" if more > 0 else ""


@dataclass
class Control:
    """A figure's positive control: a model that must solve every task point of the figure (mean at least
    ``CONTROL_LEVEL``) before the compared mixers mean anything."""
    name: str
    cells: dict[str, Cell | None]

    def passes(self) -> bool:
        return all(c is not None and c.mean >= CONTROL_LEVEL for c in self.cells.values())

    def markdown(self) -> str:
        ran = [c for c in self.cells.values() if c is not None]
        if self.passes():
            state = "passes"
        elif all(c.mean >= CONTROL_LEVEL for c in ran):
            state = (f"not run at {len(self.cells) - len(ran)} of {len(self.cells)} points: the claims below have no "
                     "control there yet")
        else:
            state = "FAILS: the claims below compare models on a recipe the control does not learn with"
        cells = "; ".join(f"{p} {c.text() + f' (n {c.n})' if c else 'not run'}" for p, c in self.cells.items())
        return f"**Control: {self.name} reaches {CONTROL_LEVEL} at every point**: {state}. {cells}."


FOOTNOTE = ("Cells: each seed's test accuracy at the learning rate and step chosen on the validation split, as mean "
            "[95% t interval, clipped to 0-1]; * marks cells of runs from before the validation split, where both "
            "were chosen on test. Effects: mean(a) - mean(b) (or - a fixed level) with Welch's 95% interval, seeds' "
            f"spreads taken as at least {stats.SD_FLOOR}. P(a > b): the share of seed pairs where a's seed is higher. "
            "GPU-minutes more: the seeds a cell lacks, times what a seed of it took (its trials' wall time over the "
            "replicas stacked with each, on the GPUs its runs had).")
