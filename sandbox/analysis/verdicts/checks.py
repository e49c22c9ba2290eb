"""Whether a run's recipe left its compared models room: a check printed beside the verdicts, not a criterion.

A verdict reads each seed's test accuracy at the step and learning rate chosen on validation. Where most trials
that learned something still improved at their last evaluation, the step budget ended mid-learning: the claims
then compare how far each model got in that budget, and cells split into seeds that made it and seeds that did not
(issue 74's "runs at the edge of learning"). Where the chosen learning rates sit at an end of the grid, a better
rate may lie beyond it. Both are said in numbers, so that a reader can weigh the verdicts, and so that a rerun's
recipe can be fixed against them before it runs.
"""
from __future__ import annotations

from collections import defaultdict

from sandbox.analysis.plot_sweep import number
from sandbox.analysis.verdicts.claims import Table, selection

LEARNED = 0.05          # a trial "learned something" when its chosen accuracy is this far above chance


def budget_check(t: Table) -> str | None:
    """A paragraph on the trials that learned something: how many still improved at their last step (chosen step
    = last step, no early stop), and how many chosen learning rates of seeds short of the early stop lie at an end
    of their grid. None where no trial learned anything."""
    early = number((t.spec.get("base", {}).get("train") or {}).get("early_stop")) or 1.0
    learned = [r for r in t.rows if _learned(r, t.chance)]
    if not learned:
        return None
    improving = [r for r in learned if still_improving(r, early)]
    n = len(learned)
    text = (f"**Budget check** (not a criterion): of the {n} trial{'s' if n > 1 else ''} whose chosen accuracy is at "
            f"least {LEARNED} above chance, {len(improving)} ({len(improving) / n:.0%}) chose the last step evaluated "
            f"without reaching the early stop ({early:g}).")
    if 2 * len(improving) >= n:
        text += (" Most were still improving when the budget ended: the claims compare recall after this many "
                 "steps, not at convergence.")
    at_edge, chosen = _rates_at_edge(t.rows, t.chance, early)
    if chosen:
        text += (f" Of the learning rates chosen for {chosen} such seed{'s' if chosen > 1 else ''} short of the "
                 f"early stop, {at_edge} lie at an end of a grid of three or more.")
    return text


def _learned(row: dict, chance: float) -> bool:
    value = selection(row)[1]
    return value is not None and value - chance >= LEARNED


def still_improving(row: dict, early: float) -> bool:
    """Whether a trial (a results row, or a run's result.json) chose its last step evaluated without reaching
    ``early``, the early stop: it was still improving when its budget ended."""
    step = _chosen_step(row)
    return step is not None and step == number(row.get("steps")) and (selection(row)[0] or 0.0) < early


def _chosen_step(row: dict) -> float | None:
    step = number(row.get("best_val_step"))
    return step if step is not None else number(row.get("best_step"))


def _rates_at_edge(rows: list[dict], chance: float, early: float) -> tuple[int, int]:
    """(seeds whose chosen rate is the lowest or highest tried, seeds that learned something short of ``early``),
    over grid points that tried at least three rates. A seed that reached the early stop is left out: where several
    rates solve the task the choice among them says nothing of the grid's range."""
    points: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = tuple(sorted((k, str(v)) for k, v in r.items() if (k == "seed" or "." in k) and k != "train.lr"))
        points[key].append(r)
    edge = chosen = 0
    for trials in points.values():
        rates = sorted({number(r.get("train.lr")) for r in trials} - {None})
        pick = max(trials, key=lambda r: selection(r)[0] if selection(r)[0] is not None else -1.0)
        if len(rates) < 3 or not _learned(pick, chance) or (selection(pick)[0] or 0.0) >= early:
            continue
        chosen += 1
        edge += number(pick.get("train.lr")) in (rates[0], rates[-1])
    return edge, chosen
