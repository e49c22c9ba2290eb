"""Matplotlib (Agg) figures for ``sandbox inspect``; each function takes plain tensors/dicts
computed by ``report.py`` and returns a Figure (the caller saves and closes it)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

DPI = 90


def suptitle(fig: plt.Figure, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width, so no line runs past its edges."""
    import textwrap
    chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))
    fig.suptitle(textwrap.fill(text, chars), fontsize=fontsize)


def save(fig: plt.Figure, path) -> None:
    """Saved with every title and label inside the picture (the box is fitted to them)."""
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)


def _grid(rows: int, cols: int, w: float = 3.4, h: float = 3.0):
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False, dpi=DPI)
    return fig, axes


def _cells(panels: dict):
    """Panels keyed by (layer, head) -> (figure, {key: axis}) with layers as rows."""
    layers = sorted({l for l, _ in panels})
    heads = sorted({h for _, h in panels})
    fig, axes = _grid(len(layers), len(heads))
    cells = {}
    for (l, h) in panels:
        cells[(l, h)] = axes[layers.index(l), heads.index(h)]
    for r, l in enumerate(layers):
        for c, h in enumerate(heads):
            if (l, h) not in panels:
                axes[r, c].axis("off")
    return fig, cells


def clustering(panels: dict, method: str) -> plt.Figure:
    """panels[(layer, head)] = (xy [N, 2], row [N], rows K, correlation ratio)."""
    fig, cells = _cells(panels)
    for (l, h), (xy, row, K, r2) in panels.items():
        ax = cells[(l, h)]
        cmap = matplotlib.colormaps["tab10" if K <= 10 else "tab20" if K <= 20 else "turbo"].resampled(K)
        sc = ax.scatter(xy[:, 0].numpy(), xy[:, 1].numpy(), c=row.numpy(), cmap=cmap, vmin=-0.5,
                        vmax=K - 0.5, s=5, alpha=0.7, linewidths=0, rasterized=True)
        ax.set_title(f"layer {l} head {h}  (R²={r2:.2f})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        bar = fig.colorbar(sc, ax=ax, fraction=0.046, pad=0.02, ticks=range(K) if K <= 20 else None)
        bar.ax.tick_params(labelsize=7)
    suptitle(fig, f"value vectors by {method}; colour = state row of the largest key entry")
    fig.tight_layout()
    return fig


def similarity(panels: dict) -> plt.Figure:
    """panels[(layer, head)] = (|cos| matrix [K, K] of one example, mean off-diagonal |cos|)."""
    fig, cells = _cells(panels)
    for (l, h), (sim, mean) in panels.items():
        ax = cells[(l, h)]
        im = ax.imshow(sim.abs().numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"layer {l} head {h}  mean off-diag {mean:.3f}", fontsize=9)
        ax.set_xlabel("state row", fontsize=8)
        ax.set_ylabel("state row", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    suptitle(fig, "row-wise |cosine similarity| of the final state (blank: row never written)")
    fig.tight_layout()
    return fig


def entropy(per_layer: dict) -> plt.Figure:
    """per_layer[layer] = entropy per head [H] (already averaged over examples)."""
    fig, axes = _grid(1, 1, w=max(3.5, 1.2 * len(per_layer) + 2))
    ax = axes[0, 0]
    layers = sorted(per_layer)
    means = [float(torch.nanmean(per_layer[l])) for l in layers]
    ax.bar(range(len(layers)), means, color="tab:blue", alpha=0.6, label="mean over heads")
    for i, l in enumerate(layers):
        v = per_layer[l].numpy()
        ax.scatter(np.full(len(v), i), v, color="k", s=12, zorder=3, label="heads" if i == 0 else None)
        ax.text(i, means[i], f"{means[i]:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(layers)), [f"layer {l}" for l in layers])
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("normalised singular-value entropy")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("singular-value entropy of the final state", fontsize=10)
    fig.tight_layout()
    return fig


def receptive_field(per_layer: dict, cap: int, threshold: float, last: int) -> plt.Figure:
    """per_layer[layer] = mean receptive field per channel [C]; ``cap`` = largest possible."""
    fig, axes = _grid(1, 1, w=6.0, h=3.2)
    ax = axes[0, 0]
    for l in sorted(per_layer):
        rf = per_layer[l].numpy()
        ax.plot(np.arange(len(rf)), rf, marker="." if len(rf) <= 64 else None, lw=1,
                label=f"layer {l} (mean {rf.mean():.1f})")
    ax.axhline(cap, color="grey", ls="--", lw=1, label=f"whole prefix (mean position {cap})")
    ax.set_xlabel("channel (head-major decay lane)")
    ax.set_ylabel("receptive field (tokens)")
    ax.set_title(f"receptive field at threshold {threshold:g}, mean over the last {last} positions", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def usage(items: list) -> plt.Figure:
    """items = [(title, use [G, n], balanced [G, 1])]: bars = mean over groups (heads), whiskers =
    min..max over groups, dashed line = the balanced level."""
    fig, axes = _grid(len(items), 1, w=max(4.5, min(14.0, 0.12 * max(u.shape[-1] for _, u, _ in items) + 3)), h=2.6)
    for ax, (title, use, bal) in zip(axes[:, 0], items):
        u = use.reshape(-1, use.shape[-1]).numpy()
        mean, lo, hi = u.mean(0), u.min(0), u.max(0)
        x = np.arange(u.shape[1])
        ax.bar(x, mean, color="tab:orange", alpha=0.75, width=0.8)
        if u.shape[0] > 1:
            ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], fmt="none", ecolor="k", lw=0.6, capsize=1.5)
        ax.axhline(float(bal.mean()), color="k", ls="--", lw=1, label="balanced use")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("choice (row / partition / memory / head)", fontsize=8)
        ax.set_ylabel("share of tokens", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
