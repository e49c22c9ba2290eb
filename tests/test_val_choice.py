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
