"""GLA vs top-k GLA on the same MQAR: row similarity, singular-value entropy, clustering.

The SSE paper (Figs. 3 and 5) predicts that row-sparse top-k updates give state rows that are
less similar to each other and a state whose singular values are spread more evenly (higher
entropy). This trains both variants (same task, seeds and learning rates), runs
``sandbox inspect`` on each, prints the numbers side by side, and writes two small comparison
pictures into ``--docs`` (default docs/).

    python benchmarks/inspect_topk.py                       # GPU: a few minutes
    python benchmarks/inspect_topk.py --steps 20 --batch-size 16 --d-model 32 --seq-len 64 --kv 8 \
        --vocab 64 --lr 3e-3 --topk 4 --device cpu --out /tmp/itk --docs /tmp/itk_docs     # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from sandbox.analysis.capture import capture, load_run
from sandbox.analysis.metrics import key_rows, pca_2d, row_cosine_similarity, mean_offdiagonal
from sandbox.analysis.report import inspect_run
from sandbox.config import load_config
from sandbox.train import train

MAX_PNG = 150_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/inspect_topk", help="run folders (rerunning resumes)")
    p.add_argument("--docs", default="docs", help="where the comparison PNGs go")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--topk", type=int, default=16, help="rows per token for the top-k variant "
                                                        "(GLA has d_model/2/heads rows per head)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--kv", type=int, default=32, help="MQAR key-value pairs")
    p.add_argument("--vocab", type=int, default=8192, help="MQAR vocabulary")
    p.add_argument("--noise", type=int, default=0, help="MQAR noise tokens (SSE Fig. 8 setting 2)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", default="1e-3,3e-3", help="comma list; the best run per variant and seed is inspected")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--layer", type=int, default=-1, help="layer drawn in the docs pictures (default: last)")
    p.add_argument("--device", default="auto")
    return p.parse_args(argv)


def base_overrides(a) -> list[str]:
    return [f"task.seq_len={a.seq_len}", f"task.num_kv_pairs={a.kv}", f"task.vocab_size={a.vocab}", f"task.noise={a.noise}",
            f"model.d_model={a.d_model}", f"model.n_heads={a.heads}", "model.n_layers=2",
            f"train.steps={a.steps}", f"train.batch_size={a.batch_size}", "train.eval_every=250",
            f"train.device={a.device}"]


def train_variant(a, label: str, extra: list[str], seed: int) -> Path:
    """Train every learning rate; return the run directory with the best accuracy."""
    best, best_dir = -1.0, None
    for lr in a.lr.split(","):
        cfg = load_config(None, base_overrides(a) + extra + [f"train.lr={lr}", f"seed={seed}"],
                          data={"task": {"name": "mqar"}})
        out = Path(a.out) / f"{label}-s{seed}-lr{lr}"
        res_path = out / "result.json"
        res = json.loads(res_path.read_text()) if res_path.is_file() else None
        if not res or res.get("status") not in ("completed", "early_stopped"):
            res = train(cfg, out, progress=False)
        print(f"  {label} seed {seed} lr {lr}: best accuracy {res['best_accuracy']:.4f} ({res['status']}, "
              f"{res['wall_time_s']:.0f} s)", flush=True)
        if res["best_accuracy"] > best:
            best, best_dir = res["best_accuracy"], out
    return best_dir


def comparison_figures(a, dirs: dict[str, Path], docs: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dev = "cuda" if a.device != "cpu" and torch.cuda.is_available() else "cpu"
    caps = {}
    for label, d in dirs.items():
        run = load_run(d, dev)
        layer = a.layer % len(run.model.mixers)
        per_layer, _ = capture(run.model, run.task, batches=2, batch_size=64, layers=[layer])
        caps[label] = (layer, per_layer[layer], run.cfg.seed)
    paths = []
    fig, axes = plt.subplots(1, len(caps), figsize=(3.6 * len(caps), 3.3), dpi=80, squeeze=False,
                             layout="constrained")
    for ax, (label, (layer, cap, _)) in zip(axes[0], caps.items()):
        sim = row_cosine_similarity(cap["final_state"])
        im = ax.imshow(sim[0, 0].abs().numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{label}: layer {layer}\nmean off-diag |cos| {mean_offdiagonal(sim):.3f}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes[0]), fraction=0.03)
    paths.append(_save(fig, docs / "inspect_gla_vs_topk_similarity.png"))
    fig, axes = plt.subplots(1, len(caps), figsize=(3.6 * len(caps), 3.3), dpi=80, squeeze=False)
    gen = torch.Generator().manual_seed(0)
    for ax, (label, (layer, cap, _)) in zip(axes[0], caps.items()):
        rows = key_rows(cap["keys"][:, :, 0]).flatten()
        vals = cap["values"][:, :, 0].reshape(-1, cap["values"].shape[-1])
        pick = torch.randperm(len(rows), generator=gen)[:1500]
        xy = pca_2d(vals[pick])
        K = cap["keys"].shape[-1]
        ax.scatter(xy[:, 0].numpy(), xy[:, 1].numpy(), c=rows[pick].numpy(), cmap="turbo", vmin=0, vmax=K - 1,
                   s=3, linewidths=0, rasterized=True)
        ax.set_title(f"{label}: layer {layer}, values by PCA\ncolour = row of largest key", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    paths.append(_save(fig, docs / "inspect_gla_vs_topk_clustering.png"))
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for dpi in (80, 60, 45):
        fig.savefig(path, dpi=dpi)
        if path.stat().st_size < MAX_PNG:
            break
    plt.close(fig)
    return path


def main(argv=None) -> int:
    a = parse_args(argv)
    K = max(1, round(a.d_model * 0.5 / a.heads))
    if not 1 <= a.topk <= K:
        print(f"--topk must be in [1, {K}] (GLA rows per head)", file=sys.stderr)
        return 2
    variants = {"GLA": ["model.mixer=gla"], f"GLA top-{a.topk}": ["model.mixer=gla", f"model.gla.topk={a.topk}"]}
    table: dict[str, list] = {}
    best_dirs: dict[str, Path] = {}
    for seed in range(a.seeds):
        for label, extra in variants.items():
            d = train_variant(a, label.replace(" ", "_"), extra, seed)
            summary = inspect_run(d, batches=4, device="cuda" if torch.cuda.is_available() and a.device != "cpu"
                                  else "cpu", log=lambda *_: None)
            acc = json.loads((d / "result.json").read_text())["best_accuracy"]
            table.setdefault(label, []).append((acc, summary))
            if seed == 0:
                best_dirs[label] = d
    print("\nvariant        seed  accuracy  layer  row similarity (mean |cos|)  signed  SV entropy  "
          "cluster R²  receptive field")
    for label, rows in table.items():
        for seed, (acc, s) in enumerate(rows):
            for layer, n in s["layers"].items():
                rf = f"{n['receptive_field']:.1f}/{n['receptive_field_cap']}" if "receptive_field" in n else "-"
                print(f"{label:<14} {seed:>4}  {acc:.4f}    {layer:>5}  {n.get('row_similarity', float('nan')):>27.4f}  "
                      f"{n.get('row_similarity_signed', float('nan')):>6.3f}  {n.get('sv_entropy', float('nan')):>10.4f}  "
                      f"{n.get('cluster_r2', float('nan')):>10.3f}  {rf}")
    print("\nmean over layers and seeds:")
    for label, rows in table.items():
        sims = [n["row_similarity"] for _, s in rows for n in s["layers"].values()]
        ents = [n["sv_entropy"] for _, s in rows for n in s["layers"].values()]
        accs = [acc for acc, _ in rows]
        print(f"  {label:<14} accuracy {sum(accs) / len(accs):.4f}  row similarity {sum(sims) / len(sims):.4f}  "
              f"SV entropy {sum(ents) / len(ents):.4f}")
    for p in comparison_figures(a, best_dirs, Path(a.docs)):
        print(f"wrote {p} ({p.stat().st_size // 1000} KB)")
    print(f"full pictures: {', '.join(str(d / 'inspect' / 'inspect.md') for d in best_dirs.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
