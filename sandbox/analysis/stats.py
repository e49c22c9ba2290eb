"""Small-sample statistics without scipy: Student's t distribution (through the regularised
incomplete beta function), t confidence intervals and Welch's unequal-variance t-test."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (continued fraction, modified Lentz)."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x: must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):                     # the fraction converges fast below the mean
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily integer) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df: must be > 0, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on ``t_cdf``)."""
    if not 0 < p < 1:
        raise ValueError(f"p: must be in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2


def mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased sample variance (variance NaN for fewer than two values)."""
    n = len(xs)
    if n == 0:
        raise ValueError("values: need at least one")
    m = sum(xs) / n
    return m, (sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else float("nan"))


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval for the mean; the bounds are NaN with one value."""
    m, v = mean_var(xs)
    n = len(xs)
    if n < 2:
        return m, float("nan"), float("nan")
    half = t_ppf(0.5 + level / 2, n - 1) * math.sqrt(v / n)
    return m, m - half, m + half


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
    ma, va = mean_var(a)
    mb, vb = mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se = math.sqrt(sa + sb)
    diff = ma - mb
    if se == 0:                    # both constant: identical means or a certain difference
        return Welch(diff, diff, diff, 0.0 if diff == 0 else math.copysign(math.inf, diff),
                     float(len(a) + len(b) - 2), 1.0 if diff == 0 else 0.0)
    df = (sa + sb) ** 2 / ((sa * sa / (len(a) - 1) if sa else 0.0) + (sb * sb / (len(b) - 1) if sb else 0.0))
    t = diff / se
    p = min(1.0, 2 * t_cdf(-abs(t), df))
    half = t_ppf(0.5 + level / 2, df) * se
    return Welch(diff, diff - half, diff + half, t, df, p)
