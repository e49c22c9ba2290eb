"""The committed sweep files: every YAML in sweeps/ validates and lists its trials, and the
issue-8 reproduction sweeps hold the axes the issue names.

References are written out here, independently of the files: the (n, k) pairs of Figure 7,
top-k as a quarter of the key rows (GLA and MetaLA: d_model / 2 / heads rows, GSA: its slots),
the Zoology grid, and each file's trial count as a product of its axis lengths, which must
also match the ``trials: N`` line of its header comment (the GPU-minute estimate there is
computed from that count). Only parsing and config validation run here (no training).
"""
from __future__ import annotations

import functools
import itertools
import math
import re
from pathlib import Path

import pytest

from sandbox.sweep.spec import load_sweep

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
ISSUE8 = ["sse_fig8_topk", "sse_state_scaling", "sse_ablations", "sla_heads", "zoology_fig2"]


@functools.lru_cache(maxsize=None)
def spec(name):
    return load_sweep(SWEEPS / f"{name}.yaml")


@functools.lru_cache(maxsize=None)
def configs(name):
    s = spec(name)
    return [(p, s.point_config(p)) for p in s.points()]


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_sweep_file_validates_and_lists_its_trials(path):
    s = load_sweep(path)
    points = s.points()
    assert points
    assert len({p.point_id for p in points}) == len(points)


@pytest.mark.parametrize("name", ISSUE8)
def test_issue8_sweeps_train_as_the_issue_asks(name):
    s = spec(name)
    header = (SWEEPS / f"{name}.yaml").read_text()
    stated = int(re.search(r"^# trials: (\d+)", header, re.M).group(1))
    expected = math.prod(len(rows) for _, rows in s.axes) * math.prod(len(v) for v in s.tune_lists.values())
    assert len(s.points()) == expected == stated
    assert "GPU-minutes" in header
    assert list(s.tune_lists) == ["train.lr"] and not s.tune_ranges
    lrs = s.tune_lists["train.lr"]
    assert len(lrs) == (4 if name == "zoology_fig2" else 3)
    for _, cfg in configs(name):
        assert cfg.train.batch_size == 256 and cfg.train.early_stop == 0.99
        assert cfg.model.n_layers == 2
        for mixer in cfg.model.layer_mixers():      # the papers' setting: no short convolution
            if mixer not in ("attention", "sse", "sla"):
                assert cfg.model.options(mixer).conv_size == 0
    if name != "zoology_fig2":                      # claims comparing close values: 3 seeds,
        assert s.axes[0] == (["seed"], [[0], [1], [2]])  # seed first so seed 0 finishes first


def test_fig8_topk_is_a_quarter_of_the_key_rows_for_every_width_and_setting():
    seen = set()
    for p, cfg in configs("sse_fig8_topk"):
        m, d = cfg.model, cfg.model.d_model
        assert m.n_heads == 2 and m.channel_mixer == "swiglu"
        topk = m.options(m.mixer).topk
        rows = 64 if m.mixer == "gsa" else d // 2 // m.n_heads
        if m.mixer == "gsa":
            assert m.options("gsa").num_slots == 64
        assert topk in (None, rows // 4)
        t = cfg.task.params
        setting = "noise" if t.noise else "gap"
        seen.add((m.mixer, d, topk is not None, setting, t.gap or t.noise, cfg.seed))
    mixers, widths = ("gla", "metala", "gsa"), (64, 128, 256, 512)
    gaps = {x[4] for x in seen if x[3] == "gap"}
    noises = {x[4] for x in seen if x[3] == "noise"}
    assert len(gaps) >= 2 and noises and 0 not in gaps
    settings = [("gap", g) for g in gaps] + [("noise", n) for n in noises]
    want = {(m, d, on, kind, length, s) for m, d, on, (kind, length), s
            in itertools.product(mixers, widths, (False, True), settings, range(3))}
    assert seen == want


def test_state_scaling_covers_every_n_k_pair_with_k_at_most_n_and_a_gla_reference():
    pairs, mixers = set(), set()
    for p, cfg in configs("sse_state_scaling"):
        mixers.add(cfg.model.mixer)
        if cfg.model.mixer == "sse":
            o = cfg.model.options("sse")
            pairs.add((o.n, o.k))
        t = cfg.task.params
        assert t.noise > 0 and t.num_kv_pairs >= 64 and t.seq_len >= 512
    assert mixers == {"gla", "sse"}
    assert pairs == {(n, k) for n in (1, 2, 4, 8, 16) for k in (1, 2, 4, 8) if k <= n}


def test_ablations_change_one_option_at_a_time_from_the_default():
    fields = ("key_map", "shared_params", "gate")
    variants = {tuple(getattr(cfg.model.options("sse"), f) for f in fields) for _, cfg in configs("sse_ablations")}
    ref = ("softmax", True, "write_read")
    assert ref in variants
    assert all(sum(a != b for a, b in zip(v, ref)) == 1 for v in variants - {ref})
    assert {v[0] for v in variants} == {"softmax", "silu"}
    assert {v[1] for v in variants} == {True, False}
    assert {v[2] for v in variants} == {"none", "write", "read", "write_read"}
    assert {(cfg.model.mixer, cfg.model.options("sse").n, cfg.model.options("sse").k)
            for _, cfg in configs("sse_ablations")} == {("sse", 4, 1)}


def test_sla_heads_compares_gla_and_softmax_gla_over_heads_at_one_width():
    seen = {(cfg.model.mixer, cfg.model.n_heads, cfg.seed) for _, cfg in configs("sla_heads")}
    assert seen == set(itertools.product(("gla", "sla"), (4, 8, 16), range(3)))
    assert {cfg.model.d_model for _, cfg in configs("sla_heads")} == {256}
    assert all(cfg.model.options("sla").base == "gla" and cfg.task.params.noise > 0 for _, cfg in configs("sla_heads"))


def test_zoology_grid_is_the_classic_one_for_five_models():
    seen = set()
    for p, cfg in configs("zoology_fig2"):
        m, t = cfg.model, cfg.task.params
        name = m.mixer
        if name == "gla" and m.options("gla").topk is not None:
            assert m.options("gla").topk == m.d_model // 2 // m.n_heads // 4
            name = "gla_topk"
        if name == "sse":
            assert (m.options("sse").n, m.options("sse").k) == (4, 1)
        assert m.positions == ("learned" if name == "attention" else "none")
        assert m.n_heads == 1 and m.channel_mixer == "none"
        seen.add((t.seq_len, t.num_kv_pairs, m.d_model, name, p.tune["train.lr"]))
    lrs = spec("zoology_fig2").tune_lists["train.lr"]
    assert [round(math.log10(x), 2) for x in lrs] == pytest.approx([-4, -10 / 3, -8 / 3, -2], abs=0.01)
    tasks = [(64, 4), (128, 8), (256, 16), (512, 64)]
    models = ["attention", "gla", "gla_topk", "sse", "gated_deltanet"]
    widths = (64, 128, 256, 512)
    assert seen == {(T, kv, d, m, lr) for (T, kv), d, m, lr in itertools.product(tasks, widths, models, lrs)}
