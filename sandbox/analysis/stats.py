"""The two statistics ``sandbox compare`` prints, on top of ``scipy.stats``: the t interval of a
mean and Welch's unequal-variance t-test with the interval of the difference."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scipy import stats


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval for the mean; the bounds are NaN with one value."""
    if len(xs) == 0:
        raise ValueError("values: need at least one")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    if min(xs) == max(xs):
        return m, m, m
    ci = stats.ttest_1samp(xs, m).confidence_interval(level)
    return m, float(ci.low), float(ci.high)


@dataclass
class Welch:
    diff: float          # mean(a) - mean(b)
    low: float           # confidence interval of the difference
    high: float
    t: float
    df: float
    p: float             # two-sided


def welch_test(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Welch:
    """Welch's two-sample t-test of mean(a) == mean(b) and the interval of the difference."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("seeds: Welch's test needs at least two values per variant")
    diff = sum(a) / len(a) - sum(b) / len(b)
    if min(a) == max(a) and min(b) == max(b):   # both constant (scipy gives NaN): equal or certainly apart
        return Welch(diff, diff, diff, 0.0 if diff == 0 else math.copysign(math.inf, diff),
                     float(len(a) + len(b) - 2), 1.0 if diff == 0 else 0.0)
    r = stats.ttest_ind(a, b, equal_var=False)
    ci = r.confidence_interval(level)
    return Welch(diff, float(ci.low), float(ci.high), float(r.statistic), float(r.df), float(r.pvalue))
