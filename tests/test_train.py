"""One training run: it learns, resumes to the same weights, logs to TensorBoard, reports NaN."""
import json
import os
import signal

import pytest
import torch

from sandbox.config import load_config
from sandbox.train import StopTraining, TrainingDiverged, train

TINY = {"task": {"name": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 16, "test_examples": 64},
        "model": {"mixer": "attention", "d_model": 16, "n_layers": 2, "positions": "learned"},
        "train": {"steps": 40, "batch_size": 16, "lr": 3e-3, "eval_every": 20, "log_every": 10,
                  "eval_batch_size": 64, "early_stop": None}}


def assert_resumes_to_the_straight_run(cfg, run_dir, straight_dir, straight):
    """Training on in ``run_dir`` completes with the bits of the run that was never interrupted."""
    resumed = train(cfg, run_dir, progress=False)
    assert resumed["status"] == "completed" and resumed["steps"] == cfg.train.steps
    a = torch.load(straight_dir / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed["final_accuracy"] == straight["final_accuracy"]


def test_interrupted_run_resumes_to_identical_weights(tmp_path):
    cfg = load_config(data=TINY)
    straight = train(cfg, tmp_path / "a", progress=False)

    def stop_at_20(step, metrics):
        if step == 20:
            raise StopTraining("pretend the machine went away")

    first = train(cfg, tmp_path / "b", progress=False, on_eval=stop_at_20)
    assert first["status"] == "stopped" and first["steps"] == 20
    assert_resumes_to_the_straight_run(cfg, tmp_path / "b", tmp_path / "a", straight)


class _CtrlCWhenPickled:
    """Stored in a checkpoint: Ctrl-C arrives while torch.save writes the file."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGINT)
        return int, (0,)


def test_a_ctrl_c_while_the_interrupt_saves_leaves_the_checkpoint_before(tmp_path, monkeypatch):
    """A second Ctrl-C (a sweep worker gets one from its launcher and one from its storage guard) can come
    while the first one's checkpoint is being written (in its background thread). The run waits for the write
    before it raises: the checkpoint is whole, at step 20, no temporary file is left, and the run resumes from
    it to the weights of a straight run."""
    from sandbox.train.step import Step
    cfg = load_config(data=TINY)
    straight = train(cfg, tmp_path / "a", progress=False)
    optimizer_state = Step.optimizer_state

    def ctrl_c_at_20(step, metrics):            # held until step 21 begins; its save then gets the second
        if step == 20:
            os.kill(os.getpid(), signal.SIGINT)
            monkeypatch.setattr(Step, "optimizer_state",
                                lambda self, *a: {**optimizer_state(self, *a), "cut": _CtrlCWhenPickled()})

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "b", progress=False, on_eval=ctrl_c_at_20)
    monkeypatch.undo()
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["state"]["step"] == 20
    assert [p.name for p in (tmp_path / "b").glob(".*.tmp")] == []
    assert_resumes_to_the_straight_run(cfg, tmp_path / "b", tmp_path / "a", straight)


def test_a_checkpoint_that_cannot_be_written_fails_the_run_with_the_reason(tmp_path, monkeypatch):
    """Checkpoints are written in a background thread: a write that fails there still ends the run as failed,
    with the writer's error in result.json, and raises it."""
    import pickle

    from sandbox.train.step import Step
    optimizer_state = Step.optimizer_state
    monkeypatch.setattr(Step, "optimizer_state", lambda self, *a: {**optimizer_state(self, *a), "bad": lambda: 0})
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError), match="pickle"):
        train(load_config(data=TINY), tmp_path, progress=False)
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["status"] == "failed" and "pickle" in res["error"] and res["steps"] in (20, 40)


def test_result_json_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = train(load_config(data=TINY), tmp_path, progress=False)
    saved = json.loads((tmp_path / "result.json").read_text())
    for key in ("config", "final_accuracy", "best_accuracy", "steps", "wall_time_s", "params", "state_size"):
        assert key in saved
    assert saved["params"] == res["params"] > 0
    assert saved["state_size"] == 2 * 2 * 16 * 16          # 2 attention layers, KV cache 2*T*d
    assert saved["config"]["model"]["d_model"] == 16
    # the wall time splits into start-up, evaluations and steps, none counted twice
    evals = len(saved["history"])
    assert evals >= 2 and saved["setup_s"] > 0 and saved["eval_s"] > 0
    assert saved["train_time_s"] + saved["eval_s"] <= saved["wall_time_s"] + 1e-3
    assert saved["setup_s"] <= saved["wall_time_s"]
    acc = EventAccumulator(str(tmp_path))                     # events in the run's own folder
    acc.Reload()
    assert {"train/loss", "test/accuracy"} <= set(acc.Tags()["scalars"])
    assert [e.value for e in acc.Scalars("test/accuracy")][-1] == pytest.approx(res["final_accuracy"])
    assert "hparams" in acc.PluginTagToContent("hparams") or acc.PluginTagToContent("hparams")
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], "hparams must not create a sub-run"


def test_nan_loss_is_reported_and_recorded(tmp_path):
    cfg = load_config(data=TINY, overrides=["train.lr=1e30", "train.grad_clip=0", "train.warmup_frac=0"])
    with pytest.raises(TrainingDiverged, match="step"):
        train(cfg, tmp_path, progress=False)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "diverged" and "loss became" in saved["error"]


def test_loss_on_scored_positions_equals_full_logits_loss():
    import torch.nn.functional as F

    from sandbox.train import build, scored_positions

    cfg = load_config(data=TINY)
    task, model = build(cfg, torch.device("cpu"))
    x, y = task.sample(16, "train", 0)
    full = model(x)
    pos, ys = scored_positions(y, task.max_targets)
    assert pos.shape == (16, 2) and (ys != -100).sum() == (y != -100).sum()
    part = model(x, pos)
    assert torch.allclose(part, full.gather(1, pos[..., None].expand(-1, -1, full.shape[-1])), atol=1e-6)
    full_loss = F.cross_entropy(full.flatten(0, 1), y.flatten(), ignore_index=-100)
    part_loss = F.cross_entropy(part.flatten(0, 1), ys.flatten(), ignore_index=-100)
    assert torch.allclose(full_loss, part_loss, atol=1e-6)


@pytest.mark.parametrize("mixer", ["attention", "gla", "metala", "mamba2", "gsa"])
def test_scored_positions_give_the_full_models_loss_and_gradients(mixer):
    """With positions, the last block runs its per-token work (the residual, the channel mixer, a linear
    mixer's output norm, gate and projection) on the scored rows only: the loss and every weight's gradient
    equal those of the full logits (float64 on the CPU)."""
    import torch.nn.functional as F

    from sandbox.train import build, scored_positions

    cfg = load_config(data={**TINY, "task": {**TINY["task"], "seq_len": 24},
                            "model": {**TINY["model"], "mixer": mixer, "n_heads": 2, "channel_mixer": "swiglu"}})
    task, model = build(cfg, torch.device("cpu"))
    model = model.double()
    x, y = task.sample(8, "train", 0)
    pos, ys = scored_positions(y, task.max_targets)
    assert pos.shape[1] < x.shape[1]

    def loss_and_grads(logits, targets):
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return loss, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    full, g_full = loss_and_grads(model(x), y)
    part, g_part = loss_and_grads(model(x, pos), ys)
    assert torch.allclose(full, part, rtol=1e-12, atol=0)
    for (name, _), a, b in zip(model.named_parameters(), g_full, g_part):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-14), name


def test_steps_per_sec_is_the_training_rate_without_the_first_steps_set_up(tmp_path, monkeypatch):
    """A first step that stands for a slow compilation (3 s) leaves the result's steps/s alone: it is the steps
    after it over their own seconds, as a clock around each later step measures them, not steps over all of them;
    the 3 s are the result's compile phase."""
    import time

    from sandbox.train.step import Step
    call, times = Step.__call__, []

    def timed(self, x, y):
        t = time.perf_counter()
        if self.calls == 0:
            time.sleep(3.0)
        call(self, x, y)
        times.append(time.perf_counter() - t)

    monkeypatch.setattr(Step, "__call__", timed)
    res = train(load_config(data=TINY), tmp_path, progress=False)
    assert res["steps"] == 40 and len(times) == 40
    clocked = 39 / sum(times[1:])                      # the later steps' own seconds (the loop adds its logging)
    assert res["steps_per_sec"] > 2 * 40 / sum(times)
    assert 0.3 * clocked < res["steps_per_sec"] <= 1.05 * clocked
    assert res["phases"]["compile"] == pytest.approx(times[0], abs=0.1)


def test_the_progress_shows_each_start_up_phase_and_then_labelled_clocks(tmp_path, capsys):
    """What `sandbox train` shows: a line per start-up phase with its seconds (why the first seconds are slow), then
    the bar, whose clocks say which is elapsed and which remaining."""
    res = train(load_config(data=TINY), tmp_path, progress=True)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "attention d16" in line]
    assert lines[0].startswith("attention d16  building the model and the data: ")
    assert lines[1].startswith("attention d16  first step: ")                   # on the CPU: no compilation, no graph
    assert f"{res['phases']['startup']:.1f} s" in lines[0] and f"{res['phases']['compile']:.1f} s" in lines[1]
    assert "40/40" in lines[-1] and "elapsed 0:" in lines[-1] and "remaining 0:00" in lines[-1]
    after = out.splitlines()[out.splitlines().index(lines[-1]) + 1]
    assert after.strip().startswith("loss ") and "acc" in after                  # on a line of its own
