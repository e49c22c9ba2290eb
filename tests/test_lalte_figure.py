"""The laLTE hybrid figure (figures/lalte_hybrid/): the LTE-MLP scorer against a per-token reference, the sweep's
window arithmetic against the task generator's own query distances, and a scaled-down copy of the whole figure run end
to end on the CPU: both sweep parts, `sandbox verdict`, the scoring through the capped cache and the picture."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from sandbox.mixers import MixerContext, build_mixer
from sandbox.mixers.lte import LTEConfig, use_cache
from sandbox.sweep.spec import load_sweep
from sandbox.tasks import make_task

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "figures" / "lalte_hybrid"
PARTS = ("lalte_hybrid_control", "lalte_hybrid")          # in the order they run
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def load(name):
    spec = importlib.util.spec_from_file_location(f"lalte_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- LTE-MLP: the retention score of a token from that token alone -----------------------------------------------

def lte(scorer, seed=0, d=16, h=2, **kw):
    torch.manual_seed(seed)
    m = build_mixer("lte", MixerContext(d, h, 0, 256), LTEConfig(scorer=scorer, rope=False, **kw)).double()
    for p in m.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def test_lte_mlp_scores_each_token_by_a_per_head_two_layer_mlp():
    """r[b, t, h] = sigmoid(W2_h silu(W1_h [k; v]_h + c1_h) + c2_h), written out per head and token; changing the
    other tokens leaves a token's score alone, where the CNN's (13 tokens wide, dilation 2) moves."""
    d, h = 16, 2
    dh = d // h
    x = torch.randn(2, 30, d, dtype=torch.float64)
    m = lte("mlp", window=13)
    _, k, v = m.project(x)
    r = m.retention(k, v)
    (w1, b1), (w2, b2) = [(c.weight, c.bias) for c in (*m.cnn.convs, m.cnn.head)]
    assert len(m.cnn.convs) == 1 and w1.shape == (h * dh, 2 * dh, 1) and w2.shape == (h, dh, 1)
    for head in range(h):
        kv = torch.cat([k[:, :, head], v[:, :, head]], -1)                      # [b, t, 2dh]
        hidden = F.silu(kv @ w1[head * dh:(head + 1) * dh, :, 0].T + b1[head * dh:(head + 1) * dh])
        want = torch.sigmoid(hidden @ w2[head, :, 0] + b2[head])
        torch.testing.assert_close(r[:, :, head], want)

    y = x.clone()
    y[:, 10] += 1.0                                       # token 10 changes: only its own score may move
    for scorer, moved in (("mlp", [10]), ("cnn", list(range(4, 17, 2)))):      # dilation 2: even offsets
        m = lte(scorer, window=13)
        ry = m.retention(*m.project(y)[1:])
        rx = m.retention(*m.project(x)[1:])
        changed = ((ry - rx).abs() > 1e-12).any(-1).any(0).nonzero().flatten().tolist()
        assert changed == moved, scorer


def test_lte_mlp_cache_equals_its_training_mask_below_the_cap():
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    m = lte("mlp", seed=1, window=13, sinks=2, cap=64)
    with torch.no_grad():                                 # scores straddling 0.5 in every head
        _, k, v = m.project(x)
        m.cnn.head.bias -= m.cnn(torch.cat([k, v], -1)).flatten(0, 1).median(0).values
        keep = m.retention(k, v) > 0.5
    assert 0 < keep.sum() < keep.numel()
    expect = m(x)
    with use_cache(m):
        got = m(x)
    torch.testing.assert_close(got, expect)


def test_lte_scorer_is_cnn_or_mlp():
    with pytest.raises(ValueError, match="scorer"):
        LTEConfig(scorer="tree")


# ---- the learning rate and step chosen on val ----------------------------------------------------------------------

def test_a_result_reads_its_val_choice_from_its_evaluations():
    from sandbox.train.record import val_choice
    history = [{"step": 2, "val/accuracy": 0.5, "test/accuracy": 0.4},
               {"step": 4, "val/accuracy": 0.7, "test/accuracy": 0.6},
               {"step": 6, "val/accuracy": 0.7, "test/accuracy": 0.9},          # a tie: the earlier step stands
               {"step": 8, "val/accuracy": 0.6, "test/accuracy": 0.95}]         # the best test, not chosen
    assert val_choice(history) == {"val_accuracy": 0.6, "best_val_accuracy": 0.7, "best_val_step": 4,
                                   "test_at_best_val": 0.6}
    assert val_choice([{"step": 2, "test/accuracy": 0.4}]) == {}


# ---- the protocol: where every query sits against every window ---------------------------------------------------

def points():
    out = []
    for part in PARTS:
        s = load_sweep(FOLDER / f"{part}.yaml")
        out += [s.point_config(p) for p in s.points()]
    return out


def test_the_sweep_puts_w_half_inside_every_window_and_2w_outside_swa_for_every_query():
    """From the generator's own examples: the distance from each query to its pair's value (which a window of W
    tokens that counts the query sees iff distance < W). G = w/2: every value inside laLTE's window and SWA's;
    G >= 2w: every value outside SWA's window (w + b). The pairs sit after the sinks and after NSA's and MoBA's
    first block, so nothing holds them for free."""
    cfgs = points()
    base = cfgs[0]
    w = base.model.options("lte").window
    pairs = base.task.params.num_kv_pairs
    swa = base.model.options("swa").window
    assert swa == w + 2 * pairs                                          # laLTE's budget: window + cap b = 2p
    assert {c.task.params.distance for c in cfgs} == {w // 2, 2 * w, 4 * w, 8 * w}
    caps = {c.model.options("lte").cap for c in cfgs if "lte" in c.model.layer_mixers()}
    assert caps == {2 * pairs, pairs // 2}
    for g in sorted({c.task.params.distance for c in cfgs}):
        cfg = next(c for c in cfgs if c.task.params.distance == g)
        task = make_task(cfg.task.params, seed=0)
        x, y = task.sample(256, split="test", index=0)
        qpos = (y != -100).nonzero()                                     # [n, 2]: (row, position)
        vals = y[qpos[:, 0], qpos[:, 1]]
        vpos = (x[qpos[:, 0]] == vals[:, None]).int().argmax(1)          # each value appears once, in the context
        dist = qpos[:, 1] - vpos
        first_pair = cfg.task.params.prefix
        assert first_pair >= max(base.model.options("lte").sinks, base.model.options("nsa").slc_block,
                                 base.model.options("moba").block_size)
        if g == w // 2:
            assert dist.max() < min(w, swa)
        else:
            assert dist.min() >= swa
        assert len(dist) == 256 * pairs


def test_the_parts_share_one_study_and_base_and_do_not_overlap():
    parts = [load_sweep(FOLDER / f"{p}.yaml") for p in PARTS]
    assert {s.name for s in parts} == {"lalte_hybrid"}
    assert parts[0].fingerprint() == parts[1].fingerprint() and parts[0].grid_keys == parts[1].grid_keys
    ids = [p.point_id for s in parts for p in s.points()]
    assert len(ids) == len(set(ids)) == 36 + 288
    fig = load("verdict")
    # every row of the verdict is a row of the sweeps, and the other way round
    cfg_rows = {(",".join(c.model.mixer) if isinstance(c.model.mixer, list) else c.model.mixer,
                 c.model.options("lte").cap, c.model.options("lte").scorer) for c in points()}
    labels = fig.rows(8)
    for row in cfg_rows:
        hits = [k for k, where in labels.items() if where["model.mixer"] == row[0]
                and where.get("model.lte.cap", row[1]) == row[1] and where.get("model.lte.scorer", row[2]) == row[2]]
        assert len(hits) == 1, row
    assert len(cfg_rows) == len(labels) == 9


# ---- the criteria, on results built to give known verdicts --------------------------------------------------------

G = (32, 128, 256, 512)
SPREAD = (0.0, 0.004, -0.004)                 # per seed, around each cell's value


def results(tmp_path, cells: dict, scores: dict) -> Path:
    """A sweep directory as `sandbox sweep` and score_twice.py leave it, from {row: {G: accuracy}} (each seed a
    little apart, each with a worse second learning rate that must not count) and {row: {G: (capped, mask)}}."""
    fig = load("verdict")
    rows = fig.rows(8)
    (tmp_path / "sweep.yaml").write_text((FOLDER / "lalte_hybrid.yaml").read_text())
    cols = ["trial", "status", "seed", "model.mixer", "model.lte.cap", "model.lte.scorer", "task.distance",
            "train.lr", "best_val_accuracy", "test_at_best_val", "best_accuracy", "run_dir"]
    out = []
    for row, by_g in cells.items():
        where = {"model.lte.cap": 16, "model.lte.scorer": "cnn", **rows[row]}
        for g, acc in by_g.items():
            for seed, d in enumerate(SPREAD):
                a = min(1.0, max(0.0, acc + d))
                for lr, v in ((3e-3, a), (1e-2, a / 2)):
                    out.append([len(out), "complete", seed, where["model.mixer"], where["model.lte.cap"],
                                where["model.lte.scorer"], g, lr, v, v, v, f"trials/{len(out)}"])
    with open(tmp_path / "results.csv", "w", newline="") as f:
        csv.writer(f).writerows([cols, *out])
    with open(tmp_path / fig.SCORES, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "G", "seed", "chosen_step", "weights_step", "mask_accuracy", "capped_accuracy"])
        for row, by_g in scores.items():
            for g, (capped, mask) in by_g.items():
                for seed, d in enumerate(SPREAD):
                    w.writerow([row, g, seed, 500, 500, min(1.0, mask + d), min(1.0, capped + d)])
    return tmp_path


def outcome(**changes):
    """Cells where every claim holds, with ``changes`` ({row: {G: accuracy}}) applied."""
    inside, beyond = {32: 0.99}, {g: None for g in G[1:]}
    cells = {"GDN+Attn.": dict.fromkeys(G, 0.998), "laLTE": dict.fromkeys(G, 0.99),
             "GDN+SWA": {**inside, **dict.fromkeys(beyond, 0.13)},
             "laLTE, cap 4": dict.fromkeys(G, 0.98), "LTE-MLP": {**inside, **dict.fromkeys(beyond, 0.5)},
             "Pure LTE": {**inside, **dict.fromkeys(beyond, 0.3)}, "GDN": dict.fromkeys(G, 0.4),
             "laNSA": dict.fromkeys(G, 0.9), "GDN+MoBA": dict.fromkeys(G, 0.8)}
    scores = {"laLTE": dict.fromkeys(G, (0.99, 0.99)), "laLTE, cap 4": {**{32: (0.98, 0.98)},
                                                                        **dict.fromkeys(beyond, (0.55, 0.98))},
              "LTE-MLP": {g: (a, a) for g, a in cells["LTE-MLP"].items()},
              "Pure LTE": {g: (a, a) for g, a in cells["Pure LTE"].items()}}
    for row, by_g in changes.items():
        cells[row] = {**cells[row], **by_g}
    return cells, scores


def judged(tmp_path, cells, scores):
    from sandbox.analysis.verdicts import judge
    control, claims = judge(results(tmp_path, cells, scores), figure=FOLDER)
    return control, {c.name.split(":")[0]: c.verdict() for c in claims}


def test_the_criteria_hold_where_built_to(tmp_path):
    control, verdicts = judged(tmp_path, *outcome())
    assert control.passes()
    assert verdicts == dict.fromkeys(("1", "2a", "2b", "3", "4", "5", "6"), "holds")


def test_capped_scores_of_another_step_than_the_chosen_one_do_not_count(tmp_path):
    """A row scored from weights of another step than the one chosen on val (a final checkpoint after the run lost
    what it had learned) is left out: claims 4 and 6 then have nothing to read."""
    from sandbox.analysis.verdicts import judge
    d = results(tmp_path, *outcome())
    path = d / load("verdict").SCORES
    path.write_text(path.read_text().replace(",500,500,", ",500,8000,"))
    _, claims = judge(d, figure=FOLDER)
    verdicts = {c.name.split(":")[0]: c for c in claims}
    assert verdicts["1"].verdict() == "holds"
    for n in ("4", "6"):
        assert verdicts[n].verdict() == "inconclusive" and all(i.effect is None for i in verdicts[n].items), n


def test_the_criteria_fail_where_built_to(tmp_path):
    """GDN carries the pairs past SWA's window; laLTE falls short of attention far away; the cache loses what the
    mask keeps; the ablations match laLTE; the binding cap costs nothing; SWA misses inside its window."""
    cells, scores = outcome(**{"GDN+SWA": {32: 0.6, 128: 0.95, 256: 0.6, 512: 0.6}, "laLTE": {512: 0.8},
                               "LTE-MLP": {128: 0.99, 256: 0.99, 512: 0.8}, "Pure LTE": {128: 0.99}})
    scores["laLTE"] = {32: (0.99, 0.99), **dict.fromkeys(G[1:], (0.8, 0.9))}
    scores["laLTE, cap 4"] = {g: (0.99, 0.99) for g in G}
    control, verdicts = judged(tmp_path, cells, scores)
    assert control.passes()
    assert verdicts == {"1": "does not hold", "2a": "does not hold", "2b": "does not hold", "3": "does not hold",
                        "4": "does not hold", "5": "does not hold", "6": "does not hold"}


def test_an_equivalence_of_rows_that_learned_nothing_is_not_compared_and_the_control_fails(tmp_path):
    cells, scores = outcome(**{"laLTE": {32: 0.12}, "GDN+SWA": {32: 0.12}, "GDN+Attn.": {512: 0.5}})
    scores["laLTE"] = {**scores["laLTE"], 512: (0.12, 0.12)}          # and the cap has no recall to cost at 8w
    control, verdicts = judged(tmp_path, cells, scores)
    assert not control.passes() and verdicts["1"] == "inconclusive" and verdicts["4"] == "inconclusive"


# ---- the whole figure, scaled down, on the CPU -------------------------------------------------------------------

def tiny(part: str, w: int = 16, pairs: int = 2) -> dict:
    """A part's sweep file at CPU size: the same rows and the same geometry in units of w, caps scaled with the
    pairs, one learning rate, two seeds, a few steps."""
    raw = yaml.safe_load((FOLDER / f"{part}.yaml").read_text())
    old_pairs = raw["base"]["task"]["num_kv_pairs"]
    prefix = 8
    raw["base"]["task"].update(seq_len=prefix + 4 * pairs - 2 + 8 * w + 2, num_kv_pairs=pairs, vocab_size=32,
                               prefix=prefix, distance=w // 2, val_examples=16, test_examples=16)
    model = raw["base"]["model"]
    model.update(d_model=16, n_heads=2)
    model["swa"]["window"] = w + 2 * pairs
    model["lte"].update(window=w, cap=2 * pairs)
    model["nsa"].update(cmp_block=4, cmp_stride=2, slc_block=8, slc_count=3, window=w)
    model["moba"].update(block_size=8, top_k=2)
    raw["base"]["train"].update(steps=4, batch_size=8, eval_every=2, eval_batch_size=16, device="cpu")
    grid = raw["grid"]
    grid["seed"] = [0, 1]
    key = "model.mixer, model.lte.cap, model.lte.scorer, model.lte.rope"
    grid[key] = [[m, cap * pairs // old_pairs, s, r] for m, cap, s, r in grid[key]]
    grid["task.distance"] = [w // 2, 2 * w, 4 * w, 8 * w]
    raw["tune"]["train.lr"] = [3.0e-3]
    return raw


@pytest.mark.slow
def test_the_figure_scaled_down_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "sweep"
    for part in PARTS:
        path = tmp_path / f"{part}.yaml"
        path.write_text(yaml.safe_dump(tiny(part), sort_keys=False))
        done = subprocess.run([sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out),
                               "--no-live"], env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 * 4 * 2 and {r["status"] for r in rows} == {"complete"}
    for r in rows:                            # each trial's val choice, read again from its own evaluations
        history = json.loads((out / r["run_dir"] / "result.json").read_text())["history"]
        vals = [h["val/accuracy"] for h in history]
        best = history[vals.index(max(vals))]
        assert len(history) == 2 and int(r["best_val_step"]) == best["step"]
        assert float(r["test_at_best_val"]) == pytest.approx(best["test/accuracy"], abs=1e-6)

    def script(*args):                        # one thread, as the sweep's workers: small ops in a loop
        done = subprocess.run([sys.executable, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    def verdict():
        return script("-m", "sandbox.cli", "verdict", out, "--figure", FOLDER)

    fig = load("verdict")
    text = verdict()
    assert "**Control: GDN+Attn. (full attention) solves every distance" in text
    for n in ("1:", "2a:", "2b:", "3:", "4:", "5:", "6:"):
        assert f"**{n}" in text, n
    assert len(fig.CLAIMS) == 7
    claim4 = text.split("**4:")[1].split("**5:")[0]
    assert claim4.count("| not run |") == 3                   # no capped-cache scores yet

    script(FOLDER / "score_twice.py", out, "--device", "cpu", "--batch-size", 16)
    with open(out / fig.SCORES, newline="") as f:
        scored = list(csv.DictReader(f))
    lte_rows = fig.lte_rows(2)
    assert sorted({r["row"] for r in scored}) == sorted(lte_rows) and len(scored) == len(lte_rows) * 4 * 2
    for r in scored:
        cap = 1 if r["row"] == "laLTE, cap 1" else 4
        assert float(r["cache_out_of_window_max"]) <= cap
        assert 0 <= float(r["capped_accuracy"]) <= 1 and 0 <= float(r["mask_accuracy"]) <= 1
        assert float(r["kv_per_head"]) <= 16 + 4 + cap and r["selected_on"] == "val"
        assert r["weights_step"] == r["chosen_step"]          # scored at the step chosen on val (chosen.pt)
    # scored again where one checkpoint is gone (trained on another machine): the file keeps that run's row, and
    # without the file that cell is left out and named
    first = (out / fig.SCORES).read_text()
    gone = Path(scored[0]["run_dir"]) / "checkpoint.pt"
    gone.unlink()
    assert "not scored here" not in script(FOLDER / "score_twice.py", out, "--device", "cpu", "--batch-size", 16)
    assert (out / fig.SCORES).read_text() == first
    (out / fig.SCORES).unlink()
    said = script(FOLDER / "score_twice.py", out, "--device", "cpu", "--batch-size", 16)
    assert f"not scored here, no checkpoint: {scored[0]['row']}, G {scored[0]['G']}, seed {scored[0]['seed']}" in said
    with open(out / fig.SCORES, newline="") as f:
        assert len(list(csv.DictReader(f))) == len(scored) - 1
    (out / fig.SCORES).write_text(first)

    text = verdict()
    claim4, claim6 = text.split("**4:")[1].split("**5:")[0], text.split("**6:")[1]
    assert "not run" not in claim4 and "not run" not in claim6
    assert claim6.count("| capped - mask ") == 3              # laLTE, LTE-MLP, Pure LTE

    script(FOLDER / "picture.py", out, tmp_path / "recall.png")
    assert (tmp_path / "recall.png").stat().st_size > 10_000


def test_the_cost_tool_names_one_kind_of_stack_per_row():
    """`sandbox bench train --sweep` times one stack of each kind: a row's four distances share one (same shapes)."""
    from sandbox.bench.estimate import sweep_kinds
    kinds = [k for p in PARTS for k in sweep_kinds(str(FOLDER / f"{p}.yaml"))]
    assert len(kinds) == len({k["name"] for k in kinds}) == 9
    assert all((k["trials"], k["stacks"], k["replicas"]) == (36, 4, 9) for k in kinds)
    assert "gated_deltanet+lte_d64_T576_conv_size4_cap4_scorercnn" in {k["name"] for k in kinds}
