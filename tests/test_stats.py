"""The verdict statistics: intervals that narrow with seeds, rules that can both hold and fail, Holm, planning.

References are independent of the module: printed t quantiles, hand arithmetic, and simulations whose truth is
known (a true effect must make a rule hold, a null must make it fail, as seeds are added)."""
import math
import random
import statistics

import pytest
from scipy import stats as scipy_stats

from sandbox.analysis import stats
from sandbox.analysis.stats import (FAILS, HOLDS, OPEN, combine, contrast, decide, difference, greater, holm, less,
                                    shift, within)


def test_welch_interval_against_hand_arithmetic_and_scipy():
    a, b = [0.9, 0.8, 0.7], [0.3, 0.2, 0.4, 0.1]
    e = difference(a, b)
    va = 0.01 / 3                                        # sample variances 0.01 and 0.016667 over n
    vb = (sum((x - 0.25) ** 2 for x in b) / 3) / 4
    assert e.estimate == pytest.approx(0.55)
    assert e.se == pytest.approx(math.sqrt(va + vb))
    assert e.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3))
    ref = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert e.interval() == pytest.approx((ref.low, ref.high))
    assert e.p_superior == 1.0


def test_a_difference_of_differences_against_hand_arithmetic():
    """(a16 - b16) - (a4 - b4): sum of signed means; variance sum of s^2 / n; Welch-Satterthwaite df."""
    a16, b16, a4, b4 = [0.6, 0.8, 0.7], [0.1, 0.3], [0.5, 0.6, 0.4, 0.5], [0.2, 0.2, 0.3]
    e = contrast([(1, a16), (-1, b16), (-1, a4), (1, b4)])
    assert e.estimate == pytest.approx((0.7 - 0.2) - (0.5 - 0.7 / 3))
    v = [0.01 / 3, 0.02 / 2, (0.02 / 3) / 4, (0.01 / 3 / 3)]          # sample variances 0.01, 0.02, 0.00667, 0.00333
    assert e.se == pytest.approx(math.sqrt(sum(v)))
    assert e.df == pytest.approx(sum(v) ** 2 / (v[0] ** 2 / 2 + v[1] ** 2 / 1 + v[2] ** 2 / 3 + v[3] ** 2 / 2))
    assert e.interval() == pytest.approx((e.estimate - scipy_stats.t.ppf(0.975, e.df) * e.se,
                                          e.estimate + scipy_stats.t.ppf(0.975, e.df) * e.se))
    two = contrast([(1, a16), (-1, b16)])                         # two terms: Welch's difference
    assert (two.estimate, two.se, two.df) == pytest.approx((difference(a16, b16).estimate, difference(a16, b16).se,
                                                            difference(a16, b16).df))
    assert math.isnan(contrast([(1, [0.5]), (-1, [0.2, 0.3])]).df)    # one seed: no interval
    with pytest.raises(ValueError, match=r"signed \+1 or -1"):
        contrast([(2, a16), (-1, b16)])


def test_exact_agreement_still_gives_an_interval_that_narrows_with_seeds():
    widths = [shift([1.0] * n, 0.99).interval() for n in (2, 3, 5, 10)]
    w = [hi - lo for lo, hi in widths]
    assert all(x > 0 for x in w) and w == sorted(w, reverse=True)
    # floor 0.01: half-width t(0.975, 2) * 0.01 / sqrt(3) = 4.303 * 0.00577
    assert w[1] / 2 == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)


def test_one_seed_decides_nothing():
    e = difference([0.99], [0.01])
    assert decide(e, greater(0.05)) == OPEN
    # a spread of one seed is unknown: planned at sd 0.5 per cell, the interval must clear 0.98 - 0.05 = 0.93 with an
    # 80% chance: n = 5: (t(0.975, 8) + t(0.8, 8)) * sqrt(0.5 / 5) = (2.306 + 0.889) * 0.316 = 1.01;
    # n = 6: (t(0.975, 10) + t(0.8, 10)) * sqrt(0.5 / 6) = (2.228 + 0.879) * 0.289 = 0.90
    assert stats.seeds_to_decide(e, greater(0.05)) == 6


def test_rules_hold_fail_and_stay_open_by_the_interval():
    big = difference([0.98, 0.97, 0.99, 0.98], [0.02, 0.03, 0.01, 0.02])
    assert decide(big, greater(0.05)) == HOLDS
    assert decide(big, less(0.0)) == FAILS
    assert decide(big, within(0.05)) == FAILS
    tiny = difference([0.50, 0.51, 0.49, 0.50, 0.50], [0.50, 0.49, 0.51, 0.50, 0.50])
    assert decide(tiny, greater(0.05)) == FAILS          # surely smaller than worth reporting
    assert decide(tiny, within(0.05)) == HOLDS
    wide = difference([0.9, 0.1, 0.9], [0.1, 0.1, 0.9])
    assert decide(wide, greater(0.05)) == OPEN
    assert decide(wide, within(0.05)) == OPEN


def test_holm_against_a_worked_example():
    # p = 0.01, 0.04, 0.03, 0.005 -> sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1 -> 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def _seeds(rng, learn_p, n, hi=0.98, lo=0.02, jitter=0.01):
    """Bimodal seeds at the edge of learning: a seed learns (near ``hi``) with probability ``learn_p``."""
    return [min(1.0, max(0.0, (hi if rng.random() < learn_p else lo) + rng.gauss(0, jitter))) for _ in range(n)]


@pytest.mark.parametrize("n", [3, 8, 20])
def test_a_true_effect_holds_and_a_null_fails_more_often_as_seeds_are_added(n):
    """Simulated cells with a known truth, rule "greater by 0.1":
    - a true effect at the edge of learning: top-k learns in 95% of seeds, dense in 10% (difference ~0.8);
    - a null of two cells that both learn (0.9 +- 0.05): the effect is surely below 0.1 once seeds are enough;
    - a bimodal null (both learn in half the seeds): it must not hold, at any n, beyond the test's 2.5%."""
    rng = random.Random(n)
    trials = 300
    true_holds = sum(decide(difference(_seeds(rng, 0.95, n), _seeds(rng, 0.10, n)), greater(0.1)) == HOLDS
                     for _ in range(trials)) / trials
    null_fails = sum(decide(difference([rng.gauss(0.9, 0.05) for _ in range(n)],
                                       [rng.gauss(0.9, 0.05) for _ in range(n)]), greater(0.1)) == FAILS
                     for _ in range(trials)) / trials
    bimodal_holds = sum(decide(difference(_seeds(rng, 0.5, n), _seeds(rng, 0.5, n)), greater(0.1)) == HOLDS
                        for _ in range(trials)) / trials
    # simulated at 400 trials: (0.61, 0.33), (0.98, 0.97), (1.0, 1.0)
    expect = {3: (0.45, 0.2), 8: (0.93, 0.9), 20: (0.99, 0.99)}[n]
    assert true_holds >= expect[0]
    assert null_fails >= expect[1]
    assert bimodal_holds <= 0.04


def _old_rule_beats(a, b):
    """The rule this module replaces: mean difference >= 0.03 and > 2 * the larger sd."""
    d = sum(a) / len(a) - sum(b) / len(b)
    s = max(stats._sd(a), stats._sd(b))
    return d >= 0.03 and d > 2 * s


def test_the_old_spread_rule_cannot_be_decided_by_more_seeds_but_the_interval_can():
    rng = random.Random(7)
    a, b = _seeds(rng, 0.8, 40), _seeds(rng, 0.2, 40)           # true difference 0.57, sd ~0.4-0.5
    assert not _old_rule_beats(a, b)                             # a spread does not shrink with n
    assert decide(difference(a, b), greater(0.1)) == HOLDS


def test_combine_every_item_with_holm_and_a_count():
    strong = difference([0.99, 0.98, 0.99], [0.01, 0.02, 0.02])
    null = difference([0.50, 0.51, 0.50], [0.50, 0.50, 0.51])
    rule = greater(0.05)
    verdict, items = combine([strong, strong, null], [rule] * 3)
    assert items == [HOLDS, HOLDS, FAILS] and verdict == FAILS
    verdict, _ = combine([strong, strong, null], [rule] * 3, need=2)
    assert verdict == HOLDS
    verdict, items = combine([strong, None], [rule] * 2)
    assert items == [HOLDS, OPEN] and verdict == OPEN
    # Holm: an item whose own interval clears the margin can stay open among many items
    edge = difference([0.30, 0.34, 0.32, 0.31], [0.20, 0.22, 0.21, 0.24])
    assert decide(edge, greater(0.05)) == HOLDS
    p_hold = stats.p_values(edge, greater(0.05))[0]
    assert p_hold * 6 > 0.025 or combine([edge] * 6, [rule] * 6)[0] == HOLDS


def test_the_rule_text_names_the_interval_the_first_of_several_items_must_clear():
    """A claim of 6 items says the first item to decide needs its 99.2% interval clear: an item alone among 6 (the
    rest not run) holds exactly when Welch's 99.17% interval, computed here from the seeds, lies above the margin."""
    from sandbox.analysis.verdicts.claims import holm_level
    assert holm_level(6) == "99.2%" and holm_level(3) == "98.3%"
    rule = greater(0.05)
    for a, b in [([0.30, 0.34, 0.32, 0.31], [0.21, 0.23, 0.22, 0.25]),       # clears 95% only
                 ([0.30, 0.34, 0.32, 0.31], [0.10, 0.12, 0.11, 0.14])]:      # clears 99.2%
        va, vb = (scipy_stats.tvar(x) / len(x) for x in (a, b))
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        d = sum(a) / len(a) - sum(b) / len(b)
        low95, low992 = (d - scipy_stats.t.ppf(1 - q / 2, df) * math.sqrt(va + vb) for q in (0.05, 0.05 / 6))
        assert low95 > 0.05
        _, items = combine([difference(a, b)] + [None] * 5, [rule] * 6)
        assert (items[0] == HOLDS) == (low992 > 0.05)
        assert items[0] in (HOLDS, OPEN)


def test_planning_matches_the_normal_approximation_and_a_simulation():
    rule = greater(0.1, expect=0.5)
    n = stats.seeds_for_power([0.3, 0.3], rule)
    z = 1.959964 + 0.841621
    normal = math.ceil(2 * 0.09 * z * z / 0.16)             # 2 s^2 (z_a + z_b)^2 / (E - m)^2 = 8.8 -> 9
    assert normal <= n <= normal + 2                         # t quantiles need a seed or two more
    rng = random.Random(3)
    hits = sum(decide(difference([rng.gauss(0.6, 0.3) for _ in range(n)], [rng.gauss(0.1, 0.3) for _ in range(n)]),
                      rule) == HOLDS for _ in range(400)) / 400
    assert 0.75 <= hits <= 0.95
    assert stats.seeds_for_power([float("nan")], greater(0.1, expect=0.5)) > n   # unknown spread plans for sd 0.5
    assert stats.seeds_for_power([0.1, 0.1], greater(0.3, expect=0.2)) is None     # cannot hold by design


def test_seeds_to_decide_decide_four_times_in_five_at_the_measured_means_and_spreads():
    """Drawn from normals at the pilot's means and spreads, the seeds it asks for decide the comparison in about 80%
    of runs; the count at which the interval would just clear the margin (the interval's own formula) decides about
    half of them, which is why it is not the count given."""
    a, b = [0.6, 0.2, 0.5], [0.1, 0.3, 0.0]
    e, rule = difference(a, b), greater(0.05)
    assert decide(e, rule) == OPEN
    n = stats.seeds_to_decide(e, rule)
    sa, sb = statistics.stdev(a), statistics.stdev(b)
    just = next(k for k in range(4, 100) if e.estimate - scipy_stats.t.ppf(0.975, 2 * (k - 1))
                * math.sqrt((sa ** 2 + sb ** 2) / k) > 0.05)
    assert n > just
    rng = random.Random(5)

    def decided(k):
        return sum(decide(difference([rng.gauss(statistics.mean(a), sa) for _ in range(k)],
                                     [rng.gauss(statistics.mean(b), sb) for _ in range(k)]), rule) == HOLDS
                   for _ in range(600)) / 600
    assert 0.72 <= decided(n) <= 0.9
    assert 0.3 <= decided(just) <= 0.65


def test_seeds_to_decide_an_inconclusive_comparison_are_more_than_it_has():
    """Spreads this unequal give Welch's interval fewer degrees of freedom (3.4 here) than the pooled ones planning
    uses (4), by which 3 seeds would have sufficed: the 3 it has did not."""
    e = difference([0.9658, 0.9741, 0.9961], [0.9985, 0.9976, 0.9971])
    assert decide(e, within(0.05)) == OPEN and e.df < 4
    assert stats.seeds_to_decide(e, within(0.05)) > 3


def test_cell_interval_stays_within_the_range_of_an_accuracy():
    m, lo, hi = stats.mean_ci([0.01, 0.0, 0.08], bounds=(0.0, 1.0))
    assert lo == 0.0 and 0.03 < hi <= 1.0
