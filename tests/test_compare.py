"""``sandbox compare`` explains itself: the report (a pure function of the seeds' values) keeps intervals of
accuracies within [0, 1], warns of a variant at chance, and words its verdict as ``sandbox verdict`` does; the tiny
preset's control learns within the preset's budget on a CPU."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch
import yaml
from scipy import stats as sps

from sandbox.analysis.compare import PRESETS, compare, report
from sandbox.analysis.stats import difference, seeds_to_decide, within

CHANCE = 0.25
ROOT = Path(__file__).resolve().parent.parent


def _report(a, b, chance=CHANCE, margin=0.05):
    return report([{"label": "mixer-a", "values": a, "chance": chance},
                   {"label": "mixer-b", "values": b, "chance": chance}], margin)


def _t_interval(xs):
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    h = sps.t.ppf(0.975, len(xs) - 1) * sd / math.sqrt(len(xs))
    return m - h, m + h


def test_a_variants_interval_is_the_t_interval_clipped_to_0_1():
    low_side, high_side = [0.0, 0.0, 0.09], [1.0, 1.0, 0.91]
    ref_a, ref_b = _t_interval(low_side), _t_interval(high_side)
    assert ref_a[0] < 0 and ref_b[1] > 1                 # the unclipped intervals leave [0, 1]
    lines, out = _report(low_side, high_side, chance=0.0)
    a, b = out["variants"]
    assert a["ci95"] == pytest.approx([0.0, ref_a[1]]) and b["ci95"] == pytest.approx([ref_b[0], 1.0])
    assert lines[0].split()[2:5] == ["0.030", "[0.000,", f"{ref_a[1]:.3f}]"]
    assert lines[1].split()[2:5] == ["0.970", f"[{ref_b[0]:.3f},", "1.000]"]


def test_the_effects_interval_is_welchs_clipped_to_minus_1_1():
    a, b = [0.0, 0.0, 0.3], [1.0, 1.0, 0.7]
    ref = sps.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert ref.high > 1
    lines, out = _report(a, b, chance=0.0)
    assert out["effect"]["ci95"] == pytest.approx([ref.low, 1.0])
    assert f"effect +0.800 [{ref.low:+.3f}, +1.000]  n 3 / 3" in next(l for l in lines if l.startswith("B - A"))


def test_a_variant_at_chance_is_warned_of_and_one_that_learned_is_not():
    lines, out = _report([0.26, 0.24, 0.25], [0.95, 0.97, 0.99])
    warnings = [l for l in lines if l.startswith("warning:")]
    assert len(warnings) == 1 and "A mixer-a sits at chance" in warnings[0] and "mixer-b" not in warnings[0]
    assert [v["at_chance"] for v in out["variants"]] == [True, False]
    assert "B better" in out["effect"]["verdict"]        # B learned and A did not: a difference, warned of


def test_a_variant_whose_learned_seeds_were_still_improving_at_the_end_gets_a_note():
    """B's two seeds that learned (the third sits at chance) chose their last step: 2 of 2, a note. A's three
    learned, one still improving: 1 of 3, no note for A. Without the per-seed record there is no note at all."""
    lines, _ = report([{"label": "a", "values": [0.9, 0.8, 0.85], "chance": CHANCE, "improving": [True, False, False]},
                       {"label": "b", "values": [0.9, 0.26, 0.95], "chance": CHANCE, "improving": [True, True, True]}])
    notes = [l for l in lines if l.startswith("note:")]
    assert len(notes) == 1 and "B: 2 of 2 seeds that learned" in notes[0] and "A:" not in notes[0]
    assert not [l for l in _report([0.9, 0.8, 0.85], [0.9, 0.26, 0.95])[0] if l.startswith("note:")]


@pytest.mark.parametrize("mean,warned", [(CHANCE + 0.04, True), (CHANCE + 0.06, False)])
def test_at_chance_means_within_the_margin_of_chance(mean, warned):
    lines, _ = _report([mean - 0.01, mean, mean + 0.01], [0.9, 0.92, 0.94])
    assert any(l.startswith("warning: A") for l in lines) == warned


def test_two_variants_at_chance_are_not_compared():
    """The issue's case: 0.018 against 0.031 on a task whose chance is 1/8."""
    lines, out = _report([0.017, 0.018, 0.019], [0.030, 0.031, 0.032], chance=1 / 8)
    warnings = [l for l in lines if l.startswith("warning:")]
    assert len(warnings) == 1 and "cannot tell the mixers apart" in warnings[0]
    assert out["effect"]["verdict"] == "not compared: both variants sit at chance"


@pytest.mark.parametrize("a,b,verdict", [
    ([0.50, 0.52, 0.54], [0.80, 0.82, 0.84], "B better"),
    ([0.80, 0.82, 0.84], [0.50, 0.52, 0.54], "A better"),
    ([0.80, 0.82, 0.84], [0.80, 0.81, 0.83], "no difference"),
])
def test_the_verdict_reads_the_welch_interval_against_the_margin(a, b, verdict):
    ref = sps.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    expected = ("B better" if ref.low > 0.05 else "A better" if ref.high < -0.05 else
                "no difference" if -0.05 < ref.low and ref.high < 0.05 else "inconclusive")
    assert expected == verdict                           # the cases are what their names say
    _, out = _report(a, b)
    assert out["effect"]["verdict"].startswith(verdict)


def test_an_inconclusive_verdict_names_the_seeds_that_would_decide_it():
    a, b = [0.60, 0.70, 0.80], [0.62, 0.70, 0.80]
    _, out = _report(a, b)
    assert out["effect"]["verdict"].startswith("inconclusive")
    n = out["effect"]["seeds_to_decide"]
    assert f"{n} seeds per cell would decide it" in out["effect"]["verdict"]
    # at n seeds per variant (same means and spreads) the interval clears the margin's nearest edge with an 80%
    # chance (the half-width plus the 80% quantile's share of the spread); at n - 1 not
    sd2 = statistics.variance(a) + statistics.variance(b)
    gap = 0.05 - abs(sum(b) / 3 - sum(a) / 3)

    def half(k):
        return (sps.t.ppf(0.975, 2 * (k - 1)) + sps.t.ppf(0.8, 2 * (k - 1))) * math.sqrt(sd2 / k)
    assert half(n) < gap <= half(n - 1)
    assert n == seeds_to_decide(difference(b, a), within(0.05))


def test_compare_words_the_comparison_as_sandbox_verdict_does():
    from sandbox.analysis.verdicts.claims import Cell, Claim, greater
    a, b = [0.60, 0.70, 0.80], [0.62, 0.70, 0.80]
    lines, _ = _report(a, b)
    claim = Claim("c")
    claim.compare("b vs a", Cell(b, [0, 1, 2]), Cell(a, [0, 1, 2]), greater(0.05))
    row = next(l for l in claim.markdown().splitlines() if l.startswith("| b vs a"))
    effect, n = row.split(" | ")[4], row.split(" | ")[3]
    assert f"effect {effect}  n {n}  " in next(l for l in lines if l.startswith("B - A"))


def test_a_margin_must_be_positive():
    with pytest.raises(ValueError, match="margin: must be > 0"):
        _report([0.5, 0.6], [0.5, 0.6], margin=0.0)


@pytest.mark.slow
def test_the_tiny_presets_control_learns_within_its_budget_on_a_cpu(tmp_path):
    """attention (learned positions), the tiny preset's control, reaches 0.9 on both seeds; the report says what was
    run before what came out."""
    lines = []
    res = compare("attention", "attention", seeds=2, out=tmp_path / "cmp", log=lines.append)
    text = "\n".join(lines)
    task = PRESETS["tiny"]["task"]
    assert f"task: mqar (seq_len {task['seq_len']}, num_kv_pairs {task['num_kv_pairs']}" in text
    assert f"chance {1 / task['num_kv_pairs']:.3f}" in text
    assert f"training: {PRESETS['tiny']['train']['steps']} steps" in text and "seeds 0, 1" in text
    assert all(v["mean"] >= 0.9 for v in res["variants"]), [v["values"] for v in res["variants"]]
    assert not any(l.startswith("warning:") for l in lines)
    verdict = next(l for l in lines if l.startswith("B - A: effect"))
    assert "n 2 / 2" in verdict and "verdict: " in verdict
    assert any(l.startswith("Rule (--margin 0.05)") for l in lines)
    assert any("test accuracy at the step chosen on val" in l for l in lines)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fig8 preset trains 3000 steps at length 320: a GPU's")
def test_the_fig8_presets_control_learns_within_its_budget_on_a_gpu(tmp_path):
    """attention with learned positions, the fig8 preset's control, reaches the early stop (0.99) in both seeds, so a
    variant at chance under this preset says something about the variant, not the budget."""
    res = compare("attention", "attention", seeds=2, task="fig8", sets=["model.positions=learned"],
                  out=tmp_path / "cmp", log=lambda line: None)
    assert all(min(v["values"]) >= 0.99 for v in res["variants"]), [v["values"] for v in res["variants"]]


def test_the_fig8_preset_is_the_figures_base_run_at_its_controls_learning_rate():
    """The library names no figure, so the figure's protocol is copied into the preset; this keeps the copy true."""
    sweep = yaml.safe_load((ROOT / "figures" / "sse_fig8_topk" / "sse_fig8_topk.yaml").read_text())
    base, preset = sweep["base"], PRESETS["fig8"]
    assert preset["task"] == base["task"]
    assert {k: v for k, v in preset["train"].items() if k != "lr"} == base["train"]
    assert preset["train"]["lr"] in sweep["tune"]["train.lr"]
    m = preset["model"]
    assert {k: m[k] for k in ("n_layers", "n_heads", "channel_mixer")} == \
        {k: base["model"][k] for k in ("n_layers", "n_heads", "channel_mixer")}
    assert sweep["grid"]["model.d_model, model.gla.conv_size, model.metala.conv_size"] == \
        [[m["d_model"], m["gla"]["conv_size"], m["metala"]["conv_size"]]]


@pytest.mark.slow   # two spawned processes importing torch: about 25 s on a 2-core CPU
def test_variants_side_by_side_in_processes_of_their_own_give_what_they_give_one_after_the_other(tmp_path):
    """``jobs`` 2 trains each variant in a spawned process of its own (on a GPU: under CUDA MPS); on the CPU, where
    training repeats to the bit, the values are those of ``jobs`` 1."""
    sets = ["train.steps=20", "train.eval_every=10"]
    runs = {j: compare("attention", "gla", seeds=1, sets=sets, jobs=j, out=tmp_path / str(j), log=lambda line: None)
            for j in (1, 2)}
    assert [v["values"] for v in runs[2]["variants"]] == [v["values"] for v in runs[1]["variants"]]
    assert [v["label"] for v in runs[2]["variants"]] == ["attention", "gla"]
