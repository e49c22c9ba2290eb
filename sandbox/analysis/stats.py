"""The statistics that verdicts and ``sandbox compare`` are written in, on top of ``scipy.stats``.

A comparison's **effect** is a difference of means over seeds: ``mean(a) - mean(b)``, or ``mean(a) - c`` for a
cell against a fixed level ``c`` (a chance level, a ceiling), or a signed sum of several cells' means (``contrast``:
a difference of differences). Its 95% interval is Welch's t interval, which
narrows as 1/sqrt(n) as seeds are added, so every comparison becomes decidable with enough seeds. A seed's spread
is taken as at least ``SD_FLOOR``: cells whose seeds agree exactly (all at 1.0, say) would otherwise get an
interval of width zero from two seeds.

A **rule**, fixed before any run, says what the effect must show and the smallest effect worth reporting
(``margin``):

``greater(m)``  holds when the whole interval lies above ``m``; does not hold when it lies below ``m`` (the
               effect, whatever its sign, is smaller than worth reporting);
``less(m)``     the mirror: holds when the interval lies below ``m`` (e.g. "at chance": mean - chance < m);
``within(m)``   equivalence: holds when the interval lies inside ``(-m, m)``; does not hold when it lies
               wholly outside.

Anything else is **inconclusive**, and ``seeds_to_decide`` says how many seeds per cell would decide it with an
80% chance (``POWER``) if the observed means and spreads are the truth: the count at which the interval would just
clear its edge is a coin flip, and extending a comparison by such counts adds seeds one round after another.
Items of one claim are combined with Holm's step-down adjustment over the claim's items (``combine``), applied to
both the "holds" and the "does not hold" side, so a claim with one item reads its verdict straight off the printed
95% interval.

``sides(m)`` are the three rules of a question with no expected direction (``sandbox compare``: B better, A better,
or no difference). ``effect_text``, ``n_text`` and ``seeds_text`` word a comparison, so that ``sandbox verdict`` and
``sandbox compare`` print it alike.

``seeds_for_power`` is the planning side: the seeds per cell that give a rule an 80% chance to hold when the
true effect is the one the claim expects, from a pilot's spreads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scipy import stats

LEVEL = 0.95
SD_FLOOR = 0.01             # the least seed-to-seed spread assumed for an accuracy (see the module docstring)
SD_UNKNOWN = 0.5            # the largest sd a value in [0, 1] can have: a one-seed pilot's spread for planning
MAX_SEEDS = 1000            # planning and "seeds to decide" stop counting here
POWER = 0.8                 # the chance that the seeds ``seeds_to_decide`` asks for decide the comparison

HOLDS, FAILS, OPEN = "holds", "does not hold", "inconclusive"


# ---- intervals ---------------------------------------------------------------------------------------------------

def mean_ci(xs: Sequence[float], level: float = LEVEL, bounds: tuple[float, float] | None = None
            ) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of a mean; NaN bounds with one value. ``bounds`` clips the interval to
    the range the quantity can take (an accuracy lies in [0, 1])."""
    if len(xs) == 0:
        raise ValueError("values: need at least one")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    if min(xs) == max(xs):
        low = high = m
    else:
        ci = stats.ttest_1samp(xs, m).confidence_interval(level)
        low, high = float(ci.low), float(ci.high)
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return m, low, high


def _sd(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return float("nan")
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@dataclass(frozen=True)
class Effect:
    """An effect with its interval: ``estimate`` = mean(a) - mean(b) (or - the level ``c``)."""
    estimate: float
    se: float                    # its standard error (Welch), the spreads floored at SD_FLOOR
    df: float                    # Welch-Satterthwaite degrees of freedom
    n: tuple[int, ...]           # seeds per cell
    sds: tuple[float, ...]       # the cells' sample sds as measured (NaN for one seed)
    p_superior: float | None = None   # the share of (seed of a, seed of b) pairs where a's seed is higher (ties 1/2)

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        if not math.isfinite(self.df):
            return -math.inf, math.inf
        h = stats.t.ppf(0.5 + level / 2, self.df) * self.se
        return self.estimate - h, self.estimate + h

    @property
    def low(self) -> float:
        return self.interval()[0]

    @property
    def high(self) -> float:
        return self.interval()[1]


def _floored(s: float) -> float:
    return max(s, SD_FLOOR) if s == s else SD_FLOOR


def difference(a: Sequence[float], b: Sequence[float]) -> Effect:
    """mean(a) - mean(b) with Welch's interval (no interval while either cell has one seed)."""
    if not a or not b:
        raise ValueError("cells: a comparison needs at least one seed on each side")
    sa, sb = _sd(a), _sd(b)
    va, vb = _floored(sa) ** 2 / len(a), _floored(sb) ** 2 / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if min(len(a), len(b)) > 1 else math.nan
    est = sum(a) / len(a) - sum(b) / len(b)
    wins = sum((x > y) + 0.5 * (x == y) for x in a for y in b) / (len(a) * len(b))
    return Effect(est, se, df, (len(a), len(b)), (sa, sb), wins)


def contrast(terms: Sequence[tuple[int, Sequence[float]]]) -> Effect:
    """``sum(sign * mean(cell))`` over ``(sign, cell)`` terms with signs +1 or -1, e.g. a difference of differences
    ((A16 - B16) - (A4 - B4): signs +1, -1, -1, +1), with Welch-Satterthwaite degrees of freedom: the variance is
    ``sum(sd^2 / n)``, each spread floored at SD_FLOOR as in ``difference`` (no interval while a cell has one
    seed). Signs only, so that planning (``seeds_for_power``: the cells' variances summed) holds for it too."""
    if not terms or any(not cell for _, cell in terms):
        raise ValueError("cells: a contrast needs at least one seed in each of its cells")
    if any(c not in (1, -1) for c, _ in terms):
        raise ValueError(f"signs: a contrast's terms are signed +1 or -1, got {[c for c, _ in terms]}")
    sds = tuple(_sd(cell) for _, cell in terms)
    vs = [_floored(s) ** 2 / len(cell) for (_, cell), s in zip(terms, sds)]
    ns = tuple(len(cell) for _, cell in terms)
    df = sum(vs) ** 2 / sum(v * v / (n - 1) for v, n in zip(vs, ns)) if min(ns) > 1 else math.nan
    est = sum(c * sum(cell) / len(cell) for c, cell in terms)
    return Effect(est, math.sqrt(sum(vs)), df, ns, sds)


def shift(a: Sequence[float], level: float) -> Effect:
    """mean(a) - ``level`` (a fixed number: a chance level, a ceiling) with the one-sample t interval."""
    if not a:
        raise ValueError("cells: a comparison needs at least one seed")
    s = _sd(a)
    se = _floored(s) / math.sqrt(len(a))
    return Effect(sum(a) / len(a) - level, se, len(a) - 1 if len(a) > 1 else math.nan, (len(a),), (s,))


# ---- rules and verdicts ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """What an effect must show (``kind``), the smallest effect worth reporting (``margin``), and the effect the
    claim expects (``expect``, for planning seeds; default: twice the margin for ``greater``, none for ``less``
    and ``within``, where the expected effect is 0)."""
    kind: str                    # "greater" | "less" | "within"
    margin: float
    expect: float | None = None

    def __post_init__(self):
        if self.kind not in ("greater", "less", "within"):
            raise ValueError(f"kind: must be greater, less or within, got {self.kind!r}")
        if self.kind == "within" and self.margin <= 0:
            raise ValueError(f"margin: an equivalence band needs a margin > 0, got {self.margin}")

    def text(self) -> str:
        if self.kind == "greater":
            return f"effect > {self.margin:+.2f}"
        if self.kind == "less":
            return f"effect < {self.margin:+.2f}"
        return f"|effect| < {self.margin:.2f}"

    def planned_effect(self) -> float:
        if self.expect is not None:
            return self.expect
        return 2 * self.margin if self.kind == "greater" and self.margin > 0 else 0.0


def greater(margin: float, expect: float | None = None) -> Rule:
    return Rule("greater", margin, expect)


def less(margin: float, expect: float | None = None) -> Rule:
    return Rule("less", margin, expect)


def within(margin: float, expect: float | None = None) -> Rule:
    return Rule("within", margin, expect)


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (NaN df: no interval, p = 1)."""
    if not df == df:
        return 1.0
    return float(stats.t.sf(t, df))


def p_values(effect: Effect, rule: Rule) -> tuple[float, float]:
    """(p of "holds", p of "does not hold"): one-sided p-values whose rejection at 2.5% is the matching side of the
    95% interval clearing the rule's margin. Degenerate effects with no interval (one seed) give (1, 1)."""
    if not effect.df == effect.df:
        return 1.0, 1.0
    e, se, df, m = effect.estimate, effect.se, effect.df, rule.margin
    up = _t_sf((e - m) / se, df)           # small when the effect is surely above m
    down = _t_sf((m - e) / se, df)         # small when the effect is surely below m
    if rule.kind == "greater":
        return up, down
    if rule.kind == "less":
        return down, up
    above = _t_sf((e - m) / se, df)        # surely above +m
    below = _t_sf((-m - e) / se, df)       # surely below -m
    inside = max(_t_sf((e + m) / se, df), _t_sf((m - e) / se, df))     # TOST: above -m and below +m
    return inside, min(1.0, 2 * min(above, below))


def decide(effect: Effect, rule: Rule, alpha: float = (1 - LEVEL) / 2) -> str:
    """One comparison's verdict at one-sided level ``alpha`` (the 95% interval's side by default)."""
    p_hold, p_fail = p_values(effect, rule)
    return HOLDS if p_hold < alpha else FAILS if p_fail < alpha else OPEN


def sides(margin: float) -> tuple[Rule, Rule, Rule]:
    """The three rules of a two-sided question with no expected direction ("is B better than A, worse, or the
    same?"): ``greater(margin)``, ``less(-margin)``, ``within(margin)``. Their 95% intervals cannot clear two of
    them at once, so at most one holds; none holding is inconclusive, decided by the seeds ``within``'s
    ``seeds_to_decide`` gives (its edges are the nearest ones the interval must clear, whichever way it goes)."""
    return greater(margin), less(-margin), within(margin)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as ``ps``)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adj, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adj[i] = running
    return adj


def combine(effects: Sequence[Effect | None], rules: Sequence[Rule], need: int | None = None,
            alpha: float = (1 - LEVEL) / 2) -> tuple[str, list[str]]:
    """A claim's verdict from its items and each item's verdict, Holm-adjusted over the items on both sides.

    ``need``: how many items must hold (default: every item). The claim holds once ``need`` items hold, and does
    not hold once more than ``len(items) - need`` items do not hold. A missing item (None: its cells have not run)
    counts as inconclusive; a claim whose verdict depends on it says so through ``open_outcomes``."""
    m = len(effects)
    need = m if need is None else need
    ps = [p_values(e, r) if e is not None else (1.0, 1.0) for e, r in zip(effects, rules)]
    hold = holm([p for p, _ in ps])
    fail = holm([q for _, q in ps])
    items = [HOLDS if h < alpha else FAILS if f < alpha else OPEN for h, f in zip(hold, fail)]
    return claim_verdict(items, need), items


def claim_verdict(items: Sequence[str], need: int) -> str:
    held, failed = items.count(HOLDS), items.count(FAILS)
    if held >= need:
        return HOLDS
    if failed > len(items) - need:
        return FAILS
    return OPEN


# ---- seeds ------------------------------------------------------------------------------------------------------

def _se_at(sds: Sequence[float], n: int) -> float:
    return math.sqrt(sum(max(s if s == s else SD_UNKNOWN, SD_FLOOR) ** 2 for s in sds) / n)


def _df_at(k: int, n: int) -> float:
    return k * (n - 1)       # Welch's df with equal n and equal spreads; a lower bound otherwise is not needed here


def _clear(rule: Rule, estimate: float) -> float:
    """How far the estimate lies from the nearest edge the rule's interval must clear (0: on it)."""
    if rule.kind == "within":
        return max(rule.margin - abs(estimate), abs(estimate) - rule.margin)
    return abs(estimate - rule.margin)


def seeds_to_decide(effect: Effect, rule: Rule, items: int = 1, power: float = POWER) -> int | None:
    """Seeds per cell that would decide an inconclusive comparison with probability ``power`` if its measured
    means and spreads are the truth (at the claim's Holm-adjusted worst level for ``items`` items: the interval
    clears the nearest edge it must clear); None beyond ``MAX_SEEDS``. More than it has: the seeds it has did not
    decide it, though the pooled degrees of freedom used here (more than Welch's where the spreads differ) may say
    they would."""
    gap = _clear(rule, effect.estimate)
    if gap <= 0:
        return None
    q = 1 - (1 - LEVEL) / 2 / items
    for n in range(max(2, max(effect.n) + 1), MAX_SEEDS + 1):
        df = _df_at(len(effect.sds), n)
        if (stats.t.ppf(q, df) + stats.t.ppf(power, df)) * _se_at(effect.sds, n) < gap:
            return n
    return None


def seeds_for_power(sds: Sequence[float], rule: Rule, power: float = 0.8, items: int = 1) -> int | None:
    """Seeds per cell (equal on each side) for ``rule`` to hold with probability ``power`` when the true effect is
    ``rule.planned_effect()``, the cells' spreads ``sds`` (NaN: unknown, planned with SD_UNKNOWN), at the level a
    claim of ``items`` items tests its smallest p-value at (Bonferroni: the conservative end of Holm). None when the
    expected effect cannot satisfy the rule or more than ``MAX_SEEDS`` are needed."""
    e = rule.planned_effect()
    gap = {"greater": e - rule.margin, "less": rule.margin - e, "within": rule.margin - abs(e)}[rule.kind]
    if gap <= 0:
        return None
    a = (1 - LEVEL) / 2 / items
    for n in range(2, MAX_SEEDS + 1):
        df, se = _df_at(len(sds), n), _se_at(sds, n)
        tail = (1 - power) / 2 if rule.kind == "within" else 1 - power      # TOST: both edges at once
        if (stats.t.ppf(1 - a, df) + stats.t.ppf(1 - tail, df)) * se <= gap:
            return n
    return None


# ---- words: how a comparison reads, in `sandbox verdict` and `sandbox compare` alike ---------------------------

def effect_text(effect: Effect, bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """``+0.123 [+0.050, +0.200]``: the estimate and its 95% interval, clipped to ``bounds`` (the range the effect
    can take: a difference of accuracies lies in [-1, 1], the whole range where a cell has one seed); ``[one
    seed]`` for an unbounded effect with no interval."""
    lo, hi = effect.interval()
    lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    if not math.isfinite(lo):
        return f"{effect.estimate:+.3f} [one seed]"
    return f"{effect.estimate:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def n_text(effect: Effect) -> str:
    """Seeds per cell, ``3 / 3``."""
    return " / ".join(str(k) for k in effect.n)


def seeds_text(effect: Effect, rule: Rule, items: int = 1) -> str:
    """How many seeds per cell would decide an inconclusive comparison, in words."""
    k = seeds_to_decide(effect, rule, items)
    if min(effect.n) < 2:
        at_most = f"{k}" if k else f"more than {MAX_SEEDS}"
        return (f"one seed measures no spread: {at_most} seeds per cell at the largest spread an accuracy can have "
                f"({POWER:.0%} chance)")
    if k is None:
        return f"more than {MAX_SEEDS} seeds per cell (its effect lies on the margin)"
    return f"{k} seeds per cell would decide it at the measured means and spreads ({POWER:.0%} chance)"

