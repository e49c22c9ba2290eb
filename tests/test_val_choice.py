"""Validation chooses, test is read: early stop, the best step and the test accuracy reported at it."""
from sandbox.config import load_config
from sandbox.train import train

BASE = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 128, "test_examples": 256,
                 "val_examples": 256},
        "model": {"mixer": "attention", "d_model": 64, "n_layers": 2, "positions": "learned", "channel_mixer": "none"},
        "train": {"steps": 1500, "batch_size": 64, "lr": 3e-3, "eval_every": 50, "device": "cpu", "early_stop": 0.5}}


def test_early_stop_and_the_chosen_step_read_validation(tmp_path):
    res = train(load_config(data=BASE), tmp_path / "run", progress=False)
    hist = res["history"]
    assert all("val/accuracy" in h and "test/accuracy" in h for h in hist)
    if res["status"] == "early_stopped":
        assert hist[-1]["val/accuracy"] >= 0.5
        assert all(h["val/accuracy"] < 0.5 for h in hist[:-1])      # stopped at the first val crossing
    best = max(hist, key=lambda h: h["val/accuracy"])
    assert res["best_val_step"] == best["step"] and res["best_val_accuracy"] == best["val/accuracy"]
    assert res["test_at_best_val"] == best["test/accuracy"]
    assert res["status"] == "early_stopped"                         # this task learns well inside 1500 steps


def test_the_weights_kept_for_analyses_are_those_of_the_step_chosen_on_val(tmp_path):
    """chosen.pt holds the weights at best_val_step: evaluated again they give the run's best val accuracy and the
    test accuracy it reports there, while the final checkpoint (a later step) gives the last evaluation's."""
    from contextlib import nullcontext

    import torch

    from sandbox.analysis.capture import load_run
    from sandbox.train import evaluate

    data = {**BASE, "train": {**BASE["train"], "steps": 240, "eval_every": 20, "lr": 3e-2, "early_stop": None}}
    res = train(load_config(data=data), tmp_path / "run", progress=False)
    assert res["best_val_step"] < res["steps"]       # this run peaks on val before its end (fixed seed)
    run = load_run(tmp_path / "run")
    assert run.step == res["best_val_step"]
    again = evaluate(run.model, run.task, 64, nullcontext, splits=("val", "test"))
    assert again["val/accuracy"] == res["best_val_accuracy"] and again["test/accuracy"] == res["test_at_best_val"]
    final = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    run.model.load_state_dict(final["model"])
    last = evaluate(run.model, run.task, 64, nullcontext, splits=("val",))
    assert last["val/accuracy"] == res["history"][-1]["val/accuracy"] != res["best_val_accuracy"]
