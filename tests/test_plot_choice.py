"""`sandbox plot` reads a cell as the verdicts do: per seed, the trial chosen on val, at its test accuracy there."""
import pytest

from sandbox.analysis.plot_sweep import _band, _resolve_y, aggregate


def row(seed, lr, val, test, best_test):
    return {"seed": seed, "train.lr": lr, "model.mixer": "gla", "best_val_accuracy": val, "test_at_best_val": test,
            "best_accuracy": best_test}


def test_a_seed_is_read_at_the_trial_chosen_on_val_not_at_its_best_test():
    rows = [row(0, 1e-3, 0.9, 0.8, 0.8), row(0, 1e-2, 0.5, 0.4, 0.95),     # the best test (0.95) is not chosen
            row(1, 1e-3, 0.2, 0.3, 0.3), row(1, 1e-2, 0.7, 0.6, 0.6)]
    y = _resolve_y(rows, "test/accuracy")
    assert y == "test_at_best_val"
    stats, tuned = aggregate(rows, y, ["model.mixer"])
    s = stats[("gla",)]
    assert s["mean"] == pytest.approx(0.7) and s["seeds"] == 2 and tuned == ["train.lr"]
    lo, hi = _band(s, "ci")
    assert 0.0 <= lo < 0.7 < hi <= 1.0                        # a t interval of (0.8, 0.6), clipped to [0, 1]


def test_runs_from_before_the_val_split_fall_back_to_the_best_test_accuracy():
    rows = [{"seed": 0, "train.lr": lr, "model.mixer": "gla", "best_accuracy": a} for lr, a in ((1e-3, 0.2), (1e-2, 0.6))]
    y = _resolve_y(rows, "test/accuracy")
    assert y == "best_accuracy" and aggregate(rows, y, ["model.mixer"])[0][("gla",)]["mean"] == 0.6
