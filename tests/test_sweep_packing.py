"""How a sweep fills a GPU: the utilisation rule, the stack size, and MPS where it cannot start."""
import textwrap

from sandbox.sweep import packing
from sandbox.sweep.spec import load_sweep


def test_a_gpu_counts_as_underfilled_from_a_minute_of_samples():
    now = 1000.0
    times = [now - 70 + 2 * i for i in range(36)]                  # every 2 s over the last 70 s
    busy = [{0: (95.0, 1.0), 1: (30.0, 1.0)} for _ in times]
    assert packing.underfilled(busy, times, 0, now) is False
    assert packing.underfilled(busy, times, 1, now) is True
    assert packing.underfilled(busy, times, 2, now) is None         # no samples of that GPU
    assert packing.underfilled(busy[:3], times[:3], 1, now) is None  # too old to count
    # only the window counts: an idle start-up long ago does not make a busy GPU underfilled
    mixed = [{0: (0.0, 1.0)} if t < now - 60 else {0: (90.0, 1.0)} for t in times]
    assert packing.underfilled(mixed, times, 0, now) is False


def test_stack_size_counts_the_trials_that_share_every_shape(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        name: s
        base:
          task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16}
          model: {mixer: attention, d_model: 16}
        grid:
          model.d_model: [16, 32]
        tune:
          train.lr: [1.0e-3, 3.0e-3, 1.0e-2]
        """))
    spec = load_sweep(path)
    assert packing.group_size(spec) == 3
    assert packing.group_size(spec, cap=2) == 2
    # seeds of a grid point stack with its learning rates: 2 seeds x 3 lrs
    path.write_text(path.read_text().replace("grid:\n", "grid:\n  seed: [0, 1]\n"))
    assert packing.group_size(load_sweep(path)) == 6


def test_mps_that_cannot_start_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                      # no nvidia-cuda-mps-control on it
    mps = packing.MPS(tmp_path)
    assert mps.start() is False and "not installed" in mps.reason
    mps.stop()                                                      # harmless when it never ran
