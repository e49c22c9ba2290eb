"""State metrics on constructed states with known answers, the t distribution against closed
forms and numerical integration, sweep aggregation by hand, and CPU smoke runs of
``sandbox inspect``, ``sandbox plot`` and ``sandbox compare``."""
from __future__ import annotations

import json
import math

import pytest
import torch

from sandbox.analysis import metrics
from sandbox.analysis.stats import mean_ci


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threads only spin against the other processes on a shared CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _orthogonal(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return q


# ---- row similarity and singular-value entropy ---------------------------------------------

def test_orthogonal_rows_have_zero_similarity_and_maximal_entropy():
    S = 3.0 * _orthogonal(8)[:, None].expand(8, 2, 8).transpose(0, 1)   # [H=2, K=8, V=8]
    sim = metrics.row_cosine_similarity(S)
    assert metrics.mean_offdiagonal(sim) == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(torch.diagonal(sim, dim1=-2, dim2=-1), torch.ones(2, 8, dtype=torch.float64))
    assert torch.allclose(metrics.singular_value_entropy(S), torch.ones(2, dtype=torch.float64))


def test_entropy_matches_footnote_formula_for_known_singular_values():
    sv = [4.0, 2.0, 1.0, 0.5, 0.0, 0.0]
    S = torch.diag(torch.tensor(sv, dtype=torch.float64)) @ _orthogonal(6, 1)
    S = _orthogonal(6, 2) @ S                       # singular values stay exactly sv
    total = sum(s * s for s in sv)
    want = -sum((s * s / total) * math.log(s * s / total) for s in sv if s > 0) / math.log(len(sv))
    assert float(metrics.singular_value_entropy(S)) == pytest.approx(want, abs=1e-10)
    # a wide state: n = min(K, V) singular values
    W = torch.cat([S, torch.zeros(6, 3, dtype=torch.float64)], 1)
    assert float(metrics.singular_value_entropy(W)) == pytest.approx(want, abs=1e-10)


def test_rank_one_state_has_zero_entropy_and_parallel_rows():
    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
    S = torch.outer(u, v)
    assert float(metrics.singular_value_entropy(S)) == pytest.approx(0.0, abs=1e-10)
    sim = metrics.row_cosine_similarity(S)
    assert metrics.mean_offdiagonal(sim) == pytest.approx(1.0, abs=1e-12)
    signs = torch.sign(u)
    assert metrics.mean_offdiagonal(sim, absolute=False) == pytest.approx(
        float(sum(signs[i] * signs[j] for i in range(5) for j in range(5) if i != j) / 20), abs=1e-12)


def test_similarity_signed_absolute_and_dead_rows():
    S = torch.tensor([[1.0, 0.0], [-0.5, math.sqrt(3) / 2], [0.0, 0.0]], dtype=torch.float64)
    sim = metrics.row_cosine_similarity(S)         # cos(row0, row1) = -0.5; row 2 never written
    assert torch.isnan(sim[2]).all() and torch.isnan(sim[:, 2]).all()
    assert metrics.mean_offdiagonal(sim, absolute=False) == pytest.approx(-0.5)
    assert metrics.mean_offdiagonal(sim) == pytest.approx(0.5)
    assert torch.isnan(metrics.singular_value_entropy(torch.zeros(3, 3)))


# ---- receptive field ------------------------------------------------------------------------

def _naive_receptive_field(log_gates: torch.Tensor, threshold: float) -> torch.Tensor:
    """Definition 4 of the SSE paper, literally: max{t - s : prod_{j=s+1..t} alpha_j >= thr}."""
    B, T, C = log_gates.shape
    alpha = log_gates.double().exp()
    out = torch.zeros(B, T, C, dtype=torch.int64)
    for b in range(B):
        for c in range(C):
            for t in range(T):
                best, prod = 0, 1.0
                for s in range(t, -1, -1):           # product over j = s+1..t
                    if s < t:
                        prod *= float(alpha[b, s + 1, c])
                    if prod >= threshold:
                        best = t - s
                out[b, t, c] = best
    return out


def test_receptive_field_constant_gate_closed_form():
    alpha, T = 0.9, 100
    g = torch.full((2, T, 3), math.log(alpha))
    rf = metrics.receptive_field(g, 1e-3)
    width = math.floor(math.log(1e-3) / math.log(alpha))       # 65: 0.9**65 >= 1e-3 > 0.9**66
    want = torch.clamp(torch.arange(T), max=width)
    assert width == 65
    assert torch.equal(rf[0, :, 0], want) and torch.equal(rf[1, :, 2], want)
    assert torch.equal(metrics.receptive_field(torch.zeros(1, T, 2)), torch.arange(T)[None, :, None].expand(1, T, 2))


def test_receptive_field_matches_definition_on_random_gates_and_channel_order():
    g = torch.Generator().manual_seed(5)
    gates = -torch.rand(2, 40, 2, 3, generator=g, dtype=torch.float64) * 0.6     # [B, T, H, K]
    gates[0, 10:20, 1, 2] = 0.0                                                    # an untouched top-k row
    rf = metrics.receptive_field(gates, 1e-2)
    assert rf.shape == (2, 40, 6)
    assert torch.equal(rf, _naive_receptive_field(gates.flatten(2), 1e-2))
    scalar = metrics.receptive_field(gates[..., 0], 1e-2)                         # [B, T, H]: one lane per head
    assert torch.equal(scalar, _naive_receptive_field(gates[..., 0], 1e-2))
    with pytest.raises(ValueError, match="threshold"):
        metrics.receptive_field(gates, 2.0)


# ---- usage ------------------------------------------------------------------------------------

def test_usage_counts_on_constructed_routing():
    # B=1, T=3, H=2, k=2 over n=4 rows
    r = torch.tensor([[[[0, 1], [2, 3]], [[0, 2], [2, 3]], [[0, 1], [3, 1]]]])
    use, bal = metrics.usage(r, n=4)
    want = torch.tensor([[3, 2, 1, 0], [0, 1, 2, 3]], dtype=torch.float64) / 3
    assert torch.allclose(use, want)
    assert torch.allclose(bal, torch.full((2, 1), 2 / 4, dtype=torch.float64))     # k/n
    s = metrics.usage_summary(use)
    assert s["unused_fraction"] == pytest.approx(2 / 8)
    assert s["max_over_balanced"] == pytest.approx(((3 / 6) * 4 + (3 / 6) * 4) / 2)
    one, bal1 = metrics.usage(torch.tensor([[0, 0, 1], [2, 0, 1]]))                # [B, T]: one choice each
    assert torch.allclose(one, torch.tensor([3, 2, 1], dtype=torch.float64) / 6)
    assert float(bal1) == pytest.approx(1 / 3)
    soft = torch.tensor([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])                       # weights [B=1, T=2, n=3]
    use_s, _ = metrics.usage(soft)
    assert torch.allclose(use_s, torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64))
    uniform = metrics.usage_summary(torch.full((4,), 0.25, dtype=torch.float64))
    assert uniform["max_over_balanced"] == pytest.approx(1.0) and uniform["usage_entropy"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="routing"):
        metrics.usage(torch.tensor([[[5]]]), n=4)


# ---- clustering and embeddings ----------------------------------------------------------------

def test_correlation_ratio_by_hand_and_pca_preserves_planar_distances():
    pts = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    assert metrics.correlation_ratio(pts, torch.tensor([0, 0, 1, 1])) == pytest.approx(100 / 104)
    g = torch.Generator().manual_seed(7)
    plane = torch.randn(50, 2, generator=g, dtype=torch.float64)
    basis = _orthogonal(5, 8)[:2]
    x = plane @ basis + 3.0
    y = metrics.pca_2d(x)
    def dist(z):
        return (z[:, None] - z[None]).norm(dim=-1)
    assert torch.allclose(dist(y), dist(plane), atol=1e-9)


def test_tsne_separates_well_separated_clusters():
    g = torch.Generator().manual_seed(9)
    centres = 6.0 * torch.eye(8, dtype=torch.float64)[:3]
    x = torch.cat([c + 0.2 * torch.randn(30, 8, generator=g, dtype=torch.float64) for c in centres])
    labels = torch.arange(3).repeat_interleave(30)
    y = metrics.tsne_2d(x, perplexity=20, iters=500)
    d = torch.cdist(y, y).fill_diagonal_(float("inf"))
    assert bool((labels[d.argmin(1)] == labels).all())
    spread = max(float(y[labels == c].std(0).norm()) for c in range(3))
    gaps = min(float((y[labels == a].mean(0) - y[labels == b].mean(0)).norm()) for a in range(3) for b in range(a))
    assert gaps > 3 * spread


def test_analyse_tolerates_missing_entries():
    from sandbox.analysis.report import analyse
    g = torch.Generator().manual_seed(0)
    attention_like = {"keys": torch.randn(2, 8, 1, 4, generator=g), "values": torch.randn(2, 8, 1, 4, generator=g)}
    soft = {"routing_memory": torch.rand(2, 8, 3, generator=g).softmax(-1)}
    numbers, panels, notes = analyse([attention_like, soft], [0, 1])
    assert "cluster_r2" in numbers[0] and "row_similarity" not in numbers[0]
    assert any("layer 0" in n and "final_state" in n for n in notes)
    assert any("layer 1" in n and "keys/values" in n for n in notes)
    assert "routing_memory" in numbers[1]["usage"]
    assert len(panels["usage"]) == 2        # argmax-key rows of layer 0 and the soft memory weights


# ---- statistics ---------------------------------------------------------------------------------

def test_mean_ci_against_a_printed_t_table():
    m, lo, hi = mean_ci([1, 2, 3, 4, 5])            # t(0.975, 4) = 2.776445 from printed tables
    assert (m, hi - m, m - lo) == pytest.approx((3.0, 2.776445 * math.sqrt(2.5 / 5), 2.776445 * math.sqrt(0.5)),
                                                abs=1e-6)
    assert mean_ci([0.9, 0.9, 0.9]) == (0.9, 0.9, 0.9)
    assert math.isnan(mean_ci([0.5])[1])


# ---- sweep plots ---------------------------------------------------------------------------------

def _fake_sweep(root):
    """result.json files: 2 mixers x 2 widths x 2 learning rates x 2 seeds."""
    acc = {}
    for mixer in ("gla", "gla_topk"):
        for d in (16, 32):
            for lr in (0.001, 0.003):
                for seed in (0, 1):
                    a = round(0.1 * (d // 16) + (0.3 if mixer == "gla_topk" else 0) + (0.05 if lr == 0.003 else 0)
                              + 0.01 * seed, 6)
                    acc[(mixer, d, lr, seed)] = a
                    run = root / f"{mixer}-{d}-{lr}-{seed}"
                    run.mkdir(parents=True)
                    cfg = {"seed": seed, "name": None, "task": {"name": "mqar", "gap": 0},
                           "model": {"mixer": mixer, "d_model": d}, "train": {"lr": lr}}
                    (run / "result.json").write_text(json.dumps(
                        {"status": "completed", "config": cfg, "best_accuracy": a, "final_accuracy": a - 0.01,
                         "state_size": d * d, "params": 100 * d}))
    return acc


def test_plot_best_over_lr_then_mean_over_seeds(tmp_path):
    from sandbox.analysis.plot_sweep import plot_sweep
    from sandbox.cli import main
    acc = _fake_sweep(tmp_path)
    res = plot_sweep(tmp_path, x="model.d_model", hue="model.mixer", log=lambda *_: None)
    assert res["tuned"] == ["train.lr"] and res["y"] == "test/accuracy"
    for (mixer, d), s in res["points"].items():
        best = [max(acc[(mixer, d, lr, seed)] for lr in (0.001, 0.003)) for seed in (0, 1)]
        assert s["mean"] == pytest.approx(sum(best) / 2) and (s["min"], s["max"]) == pytest.approx((min(best), max(best)))
        assert s["seeds"] == 2 and s["trials"] == 4
    assert (tmp_path / "plots").is_dir() and list((tmp_path / "plots").glob("*.png"))
    assert main(["plot", str(tmp_path), "--x", "model.d_model", "--heatmap", "model.mixer",
                 "--out", str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path), "--x", "model.width"]) == 2          # one-line error


def test_plot_leaves_out_trials_that_did_not_finish(tmp_path):
    """A failed trial's row has best_accuracy 0 and an interrupted one its value so far: neither is a result.
    A cell whose trials all failed has no point at all (the Figure 8 plot showed such a cell at 0.0)."""
    from sandbox.analysis.plot_sweep import plot_sweep
    head = "trial,status,seed,model.mixer,train.lr,best_accuracy\n"
    rows = ["0,complete,0,gla,0.001,0.6", "1,complete,0,gla,0.003,0.8", "2,failed,0,gla,0.01,0",
            "3,requeued,1,gla,0.001,0.95", "4,complete,1,gla,0.001,0.7", "5,waiting,1,gla,0.003,",
            "6,failed,0,gsa,0.001,0", "7,failed,1,gsa,0.001,0"]
    (tmp_path / "results.csv").write_text(head + "\n".join(rows) + "\n")
    lines = []
    res = plot_sweep(tmp_path, x="model.mixer", log=lines.append)
    assert list(res["points"]) == [("gla",)]
    s = res["points"][("gla",)]
    assert s["mean"] == pytest.approx((0.8 + 0.7) / 2) and s["seeds"] == 2 and s["trials"] == 3
    assert "left out 5 trials that did not finish (3 failed, 1 requeued, 1 waiting)" in lines


def test_categorical_x_is_not_joined_by_lines_and_titles_fit(tmp_path):
    """Mixer names on x are categories: markers with error bars side by side, no line from one name to
    the next; a long title wraps inside the figure instead of running past its edges."""
    from sandbox.analysis.plot_sweep import aggregate, draw, load_rows

    _fake_sweep(tmp_path)
    rows, _ = load_rows(tmp_path)
    points, tuned = aggregate(rows, "best_accuracy", ["model.d_model", "model.mixer"])
    fig = draw(points, ["model.d_model", "model.mixer"], "model.mixer", "best_accuracy", tuned,
               hue="model.d_model")
    ax = fig.axes[0]
    joined = [line for line in ax.lines if line.get_linestyle() not in ("None", "", " ") and len(line.get_xdata()) > 1]
    assert not joined
    xs = sorted({round(float(x), 3) for line in ax.lines if line.get_marker() == "o" for x in line.get_xdata()})
    assert len(xs) == 4 and xs[0] < 0 < xs[1] < 1 < xs[3]            # two hues dodged around each of 2 names
    numeric = draw(points, ["model.mixer", "model.d_model"], "model.d_model", "best_accuracy", tuned,
                   hue="model.mixer")
    assert any(len(line.get_xdata()) == 2 for line in numeric.axes[0].lines)      # numbers are joined
    # an accuracy has the same 0..1 scale in every panel, so a panel near chance does not look like a curve
    panels = draw(points, ["model.mixer", "model.d_model"], "model.d_model", "best_accuracy", tuned,
                  col="model.mixer")
    assert len(panels.axes) == 2 and {ax.get_ylim() for ax in panels.axes} == {(-0.02, 1.02)}
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, "the title runs past the figure's edges"


def test_a_hue_value_has_one_colour_in_every_panel():
    """A panel that lacks a value (Zoology's (512, 64) before Gated DeltaNet ran) must not shift the
    colours of the values after it: each value keeps its colour across panels."""
    from matplotlib.colors import to_hex
    from sandbox.analysis.plot_sweep import draw

    st = {"mean": 0.5, "min": 0.5, "max": 0.5, "std": 0.0}
    points = {(p, h, d): st for p in (4, 64) for h in ("attention", "gated_deltanet", "gla") for d in (64, 128)
              if not (p == 64 and h == "gated_deltanet")}
    fig = draw(points, ["pairs", "mixer", "d"], "d", "best_accuracy", ["train.lr"], hue="mixer", col="pairs")
    colours = [{line.get_label(): to_hex(line.get_color()) for line in ax.lines} for ax in fig.axes]
    assert colours[1]["gla"] == colours[0]["gla"] != colours[0]["gated_deltanet"]
    assert colours[1]["attention"] == colours[0]["attention"]


# ---- smoke: a tiny trained run through the CLI ----------------------------------------------------

TINY = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 32, "test_examples": 64},
        "model": {"mixer": "gla", "d_model": 16, "n_layers": 2, "n_heads": 2, "gla": {"topk": 2}},
        "train": {"steps": 30, "batch_size": 32, "lr": 3e-3, "eval_every": 15, "eval_batch_size": 64,
                  "device": "cpu", "early_stop": None}}


def test_inspect_smoke_renders_every_picture(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sandbox.cli import main
    from sandbox.config import config_from_dict
    from sandbox.train import train
    run = tmp_path / "run"
    train(config_from_dict(TINY), run, progress=False)
    assert main(["inspect", str(run), "--batches", "2", "--batch-size", "16"]) == 0
    names = ("clustering", "similarity", "entropy", "receptive_field", "usage")
    for n in names:
        png = run / "inspect" / f"{n}.png"
        assert png.is_file() and png.stat().st_size < 150_000
    md = (run / "inspect" / "inspect.md").read_text()
    assert all(f"({n}.png)" in md for n in names)
    summary = json.loads((run / "inspect" / "summary.json").read_text())
    for layer in ("0", "1"):
        n = summary["layers"][layer]
        assert 0 <= n["row_similarity"] <= 1 and 0 <= n["sv_entropy"] <= 1
        assert n["usage"]["routing"]["choices"] == 4                 # K = 16 * 0.5 / 2 rows per head
    ea = EventAccumulator(str(run), size_guidance={"images": 0})
    ea.Reload()
    assert {f"inspect/{n}" for n in names} <= set(ea.Tags()["images"])
    # one layer, t-SNE, another folder, no TensorBoard
    out = tmp_path / "tsne"
    assert main(["inspect", str(run), "--layer", "1", "--tsne", "--batches", "1", "--batch-size", "4",
                 "--out", str(out), "--no-tensorboard"]) == 0
    assert (out / "clustering.png").is_file() and list(json.loads((out / "summary.json").read_text())["layers"]) == ["1"]
    assert main(["inspect", str(run), "--layer", "5"]) == 2
    assert main(["inspect", str(tmp_path)]) == 2                       # not a run directory


def test_compare_smoke_and_variant_syntax(tmp_path):
    import yaml

    from sandbox.analysis.compare import compare, variant_config
    label, data = variant_config("gla+topk=4+balance_alpha=0.01", "fig8", sets=["model.d_model=64"])
    assert label == "gla+topk=4+balance_alpha=0.01"
    assert data["model"]["mixer"] == "gla"
    assert data["model"]["gla"] == {"conv_size": 4, "topk": 4, "balance_alpha": 0.01}   # the preset's conv kept
    assert data["task"]["gap"] > 0 and data["model"]["d_model"] == 64
    base = dict(TINY, train=dict(TINY["train"], steps=4, eval_every=4))
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(base))
    lines = []
    res = compare("gla", "gla+topk=2", seeds=2, task=str(tmp_path / "tiny.yaml"), out=tmp_path / "cmp",
                  log=lines.append)
    a, b = (v["values"] for v in res["variants"])
    assert len(a) == len(b) == 2
    assert res["effect"]["b_minus_a"] == pytest.approx(sum(b) / 2 - sum(a) / 2) and res["effect"]["n"] == [2, 2]
    assert any(l.startswith("B - A: effect") and "n 2 / 2" in l for l in lines)
    again = compare("gla", "gla+topk=2", seeds=2, task=str(tmp_path / "tiny.yaml"), out=tmp_path / "cmp",
                    log=lambda *_: None)                               # finished runs are reused
    assert [v["values"] for v in again["variants"]] == [a, b]
    assert again["wall_time_s"] < res["wall_time_s"]


def test_usage_option_count_from_keys_only_when_routing_picks_key_rows():
    from sandbox.analysis.report import analyse
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 1, 8, generator=g)
    idx = logits.topk(2, dim=-1).indices                                  # top-2 of 8 rows
    keys = torch.zeros_like(logits).scatter_(-1, idx, logits.gather(-1, idx).softmax(-1))
    values = torch.randn(2, 6, 1, 3, generator=g)
    partitions = torch.zeros(2, 6, 1, 1, dtype=torch.int64)               # every token to partition 0 of 8 rows
    mask = torch.zeros(2, 6, 5, dtype=torch.bool)
    mask[..., 1] = True
    layers = [{"keys": keys, "values": values, "routing": idx},
              {"keys": keys, "values": values, "routing": partitions, "routing_blocks": mask,
               "gates": torch.rand(2, 6, 1, generator=g)}]
    numbers, panels, notes = analyse(layers, [0, 1])
    assert numbers[0]["usage"]["routing"]["choices"] == 8                  # rows of the key
    assert numbers[1]["usage"]["routing"]["choices"] == 1                  # largest index + 1
    assert numbers[1]["usage"]["routing_blocks"]["choices"] == 5
    assert numbers[1]["usage"]["routing_blocks"]["max_over_balanced"] == pytest.approx(5.0)
    assert any("not log-decays" in n for n in notes) and "receptive_field" not in numbers[1]


def test_plot_loss_is_minimised_over_history_and_tuned_keys(tmp_path):
    from sandbox.analysis.plot_sweep import plot_sweep
    for h in (1, 2, 4):
        for lr in (1, 2):
            run = tmp_path / f"{h}-{lr}"
            run.mkdir()
            hist = [{"test/loss": 3.0 / h + lr}, {"test/loss": 2.0 / h + lr}, {"test/loss": 2.5 / h + lr}]
            (run / "result.json").write_text(json.dumps({"config": {"seed": 0, "model": {"n_heads": h},
                                                                    "train": {"lr": lr}},
                                                         "best_accuracy": 0.5, "history": hist}))
    res = plot_sweep(tmp_path, x="model.n_heads", y="test/loss", log=lambda *_: None)
    assert {k[0]: v["mean"] for k, v in res["points"].items()} == pytest.approx({1: 3.0, 2: 2.0, 4: 1.5})


# ---- the pictures: size, labels and words that match the run ---------------------------------------

def _captured(stateful: bool, seq_len: int, heads: int = 1, seed: int = 0) -> dict:
    """What a layer records over 2 examples: keys and values, and for a recurrent layer its log-decay
    gates (one per state row) and final state."""
    g = torch.Generator().manual_seed(seed)
    B, K, V = 2, 6, 5
    cap = {"keys": torch.randn(B, seq_len, heads, K, generator=g),
           "values": torch.randn(B, seq_len, heads, V, generator=g)}
    if stateful:
        cap["gates"] = -torch.rand(B, seq_len, heads, K, generator=g)
        cap["final_state"] = torch.randn(B, heads, K, V, generator=g)
    return cap


def _figures_of(layers: list[dict], mixers: list[str]):
    from sandbox.analysis.report import _figures, analyse
    _, panels, _ = analyse(layers, list(range(len(layers))), mixers=mixers)
    return _figures(panels, "pca")


def _texts(fig) -> str:
    return " ".join([fig._suptitle.get_text() if fig._suptitle else ""]
                    + [t for ax in fig.axes for t in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())])


@pytest.mark.parametrize("layers,heads", [(1, 1), (2, 1), (2, 2)])
def test_every_picture_is_wide_labelled_and_has_its_colour_bars(tmp_path, layers, heads):
    """Each picture is at least 800 px wide as saved, every panel names both axes and has a title, and
    every scatter or image carries a labelled colour bar."""
    import matplotlib.pyplot as plt

    from sandbox.analysis.plots import save
    figs = _figures_of([_captured(True, 16, heads, seed=i) for i in range(layers)], ["gla"] * layers)
    assert set(figs) == {"clustering", "similarity", "entropy", "receptive_field", "usage"}
    for name, fig in figs.items():
        colour_bars = {m.colorbar.ax for ax in fig.axes for m in ax.collections + ax.images if m.colorbar}
        panels = [ax for ax in fig.axes if ax not in colour_bars and ax.axison]
        assert panels, name
        for ax in panels:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), (name, ax.get_title())
        if name in ("clustering", "similarity"):
            assert len(colour_bars) == len(panels) == layers * heads, name
            assert all(bar.get_ylabel() for bar in colour_bars), name
        save(fig, tmp_path / f"{name}.png")
        height, width = plt.imread(tmp_path / f"{name}.png").shape[:2]
        assert width >= 800, (name, width, height)
        fig.canvas.draw()
        box = fig._suptitle.get_window_extent() if fig._suptitle else None
        assert box is None or (box.x0 >= 0 and box.x1 <= fig.bbox.x1), f"{name}: the title runs past the edges"
        plt.close(fig)


def test_picture_words_match_the_run():
    """A layer without a state is coloured by key channel, not by state row; the receptive field names the
    positions it averaged over (all 16 of a 16-token sequence; the last 128 of 200)."""
    import matplotlib.pyplot as plt

    attention = _figures_of([_captured(False, 16)], ["attention"])
    assert set(attention) == {"clustering", "usage"}
    for fig in attention.values():
        assert "key channel" in _texts(fig) and "state row" not in _texts(fig)
    gla = _figures_of([_captured(True, 16)], ["gla"])
    assert "state row" in _texts(gla["clustering"]) and "key channel" not in _texts(gla["clustering"])
    assert "all 16 positions" in _texts(gla["receptive_field"]) and "128" not in _texts(gla["receptive_field"])
    long = _figures_of([_captured(True, 200)], ["gla"])
    assert "the last 128 of 200 positions" in _texts(long["receptive_field"])
    for fig in [*attention.values(), *gla.values(), *long.values()]:
        plt.close(fig)


def test_plot_puts_learning_rates_on_a_log_axis(tmp_path):
    """lr 0.001 and 0.003 on a linear axis crowd their ticks; a learning rate gets a log axis by itself,
    a width of 16 and 32 keeps a linear one, and --logx / --no-logx decide otherwise."""
    from sandbox.analysis.plot_sweep import aggregate, draw, load_rows
    from sandbox.cli import main

    _fake_sweep(tmp_path)
    rows, _ = load_rows(tmp_path)

    def scale(x, **kw):
        points, tuned = aggregate(rows, "best_accuracy", [x])
        return draw(points, [x], x, "best_accuracy", tuned, **kw).axes[0].get_xscale()

    assert scale("train.lr") == "log" and scale("model.d_model") == "linear"
    assert scale("train.lr", logx=False) == "linear" and scale("model.d_model", logx=True) == "log"
    assert main(["plot", str(tmp_path), "--x", "train.lr", "--out", str(tmp_path / "lr.png")]) == 0
    assert main(["plot", str(tmp_path), "--x", "model.mixer", "--logx"]) == 2      # names have no log
