"""The README's first command: `sandbox train` (the packaged quickstart) learns on a CPU, and `sandbox inspect`
on its run draws all five pictures of the recurrent state it learned."""
from __future__ import annotations

import json

import pytest

from sandbox.cli import main, quickstart_path
from sandbox.config import load_config

PICTURES = ["clustering.png", "entropy.png", "receptive_field.png", "similarity.png", "usage.png"]


@pytest.mark.slow
def test_quickstart_learns_and_inspect_draws_all_five_pictures(tmp_path, capsys):
    cfg = load_config(quickstart_path())
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--no-progress"]) == 0
    res = json.loads((run / "result.json").read_text())
    assert res["status"] == "early_stopped", res["status"]
    # the early stop reads the validation split; the test split, read at that step, is close but not the same
    assert res["best_val_accuracy"] >= cfg.train.early_stop, res["best_val_accuracy"]
    assert res["test_at_best_val"] >= 0.9, res["test_at_best_val"]
    assert "test accuracy" in capsys.readouterr().out

    assert main(["inspect", str(run), "--no-tensorboard"]) == 0
    summary = json.loads((run / "inspect" / "summary.json").read_text())
    assert summary["pictures"] == PICTURES, summary["notes"]
    assert not summary["notes"]
    assert all((run / "inspect" / name).stat().st_size > 10_000 for name in PICTURES)
