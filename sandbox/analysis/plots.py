"""Matplotlib (Agg) figures for ``sandbox inspect``; each function takes plain tensors/dicts
computed by ``report.py`` and returns a Figure (the caller saves and closes it).

Every figure is at least ``MIN_WIDTH`` inches wide at ``DPI`` (a picture of 850 px before the
saved box is fitted to what is drawn), names both axes, labels its colour bars, and lays itself
out with constrained layout so that titles, labels and colour bars stay inside it.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

DPI = 100
MIN_WIDTH = 8.5        # inches


def suptitle(fig: plt.Figure, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width, so no line runs past its edges."""
    import textwrap
    chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))
    fig.suptitle(textwrap.fill(text, chars), fontsize=fontsize)


def save(fig: plt.Figure, path) -> None:
    """Saved with every title and label inside the picture (the box is fitted to them)."""
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)


def _figure(rows: int, cols: int, w: float, h: float):
    """``rows x cols`` panels of about ``w x h`` inches, the whole at least ``MIN_WIDTH`` wide."""
    fig, axes = plt.subplots(rows, cols, figsize=(max(MIN_WIDTH, w * cols), h * rows), squeeze=False, dpi=DPI,
                             layout="constrained")
    return fig, axes


def _cells(panels: dict, w: float, h: float, square: bool = False):
    """Panels keyed by (layer, head) -> (figure, {key: axis}): layers as rows and heads as columns, or the
    layers side by side when each has one head. Few columns get taller panels, so that what they draw
    spans the minimum width: a ``square`` image (with its colour bar) is as wide as its panel is tall."""
    layers = sorted({l for l, _ in panels})
    heads = sorted({h for _, h in panels})
    place = ({(l, heads[0]): (0, i) for i, l in enumerate(layers)} if len(heads) == 1 else
             {(l, hd): (layers.index(l), heads.index(hd)) for l in layers for hd in heads})
    rows = 1 + max(r for r, _ in place.values())
    cols = 1 + max(c for _, c in place.values())
    h = max(h, MIN_WIDTH / cols - 0.9) if square else max(h, 0.5 * MIN_WIDTH / cols)
    fig, axes = _figure(rows, cols, max(w, h + 0.9) if square else w, h)
    for key, (r, c) in place.items():
        if key not in panels:
            axes[r, c].axis("off")
    return fig, {key: axes[r, c] for key, (r, c) in place.items() if key in panels}


def _label(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)


def clustering(panels: dict, method: str) -> plt.Figure:
    """panels[(layer, head)] = dict(xy [N, 2], colour [N] (argmax of each token's key), choices (the key's
    width), r2 (correlation ratio), stateful (the key's entries are rows of a recurrent state))."""
    fig, cells = _cells(panels, w=4.3, h=3.6)
    axis = "PC" if method == "PCA" else method
    words = set()
    for (l, h), p in panels.items():
        ax, K = cells[(l, h)], p["choices"]
        word = "state row" if p["stateful"] else "key channel"
        words.add(word)
        cmap = matplotlib.colormaps["tab10" if K <= 10 else "tab20" if K <= 20 else "turbo"].resampled(K)
        sc = ax.scatter(p["xy"][:, 0].numpy(), p["xy"][:, 1].numpy(), c=p["colour"].numpy(), cmap=cmap,
                        vmin=-0.5, vmax=K - 0.5, s=5, alpha=0.7, linewidths=0, rasterized=True)
        _label(ax, f"{axis} 1", f"{axis} 2", f"layer {l}, head {h}: R² = {p['r2']:.2f}")
        ax.set_xticks([])
        ax.set_yticks([])
        bar = fig.colorbar(sc, ax=ax, ticks=range(0, K, max(1, K // 8)))
        bar.set_label(f"{word} of the largest key entry", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    n = len(next(iter(panels.values()))["colour"])
    suptitle(fig, f"Value vectors of {n} test tokens placed by {method}, coloured by the "
                  f"{' or '.join(sorted(words))} where each token's key is largest "
                  "(R²: share of the values' variance the colours explain)")
    return fig


def similarity(panels: dict) -> plt.Figure:
    """panels[(layer, head)] = (|cos| matrix [K, K] of one example, mean off-diagonal |cos|); NaN where a
    row was never written."""
    fig, cells = _cells(panels, w=4.3, h=3.8, square=True)
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="0.6")
    blank = False
    for (l, h), (sim, mean) in panels.items():
        ax = cells[(l, h)]
        blank |= bool(torch.isnan(sim).any())
        im = ax.imshow(sim.abs().numpy(), cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        _label(ax, "state row", "state row", f"layer {l}, head {h}: mean off-diagonal {mean:.3f}")
        fig.colorbar(im, ax=ax).set_label("|cosine similarity|", fontsize=8)
    suptitle(fig, "Row-wise |cosine similarity| of the final state, first test example"
                  + ("; grey: a row never written" if blank else ""))
    return fig


def entropy(per_layer: dict, examples: int) -> plt.Figure:
    """per_layer[layer] = entropy per head [H] (already averaged over ``examples`` test examples)."""
    fig, axes = _figure(1, 1, w=MIN_WIDTH, h=3.6)
    ax = axes[0, 0]
    layers = sorted(per_layer)
    means = [float(torch.nanmean(per_layer[l])) for l in layers]
    ax.bar(range(len(layers)), means, width=0.5, color="tab:blue", alpha=0.6, label="mean over heads")
    for i, l in enumerate(layers):
        v = per_layer[l].numpy()
        ax.scatter(np.full(len(v), i), v, color="k", s=12, zorder=3, label="one head" if i == 0 else None)
        ax.text(i, means[i], f"{means[i]:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(layers)), [str(l) for l in layers])
    ax.set_xlim(-0.75, len(layers) - 0.25)
    ax.set_ylim(0, 1.08)
    _label(ax, "layer", "normalised singular-value entropy",
           f"Singular-value entropy of the final state, mean over {examples} test examples "
           "(1: every direction used evenly; 0: rank one)")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def receptive_field(per_layer: dict, cap: float, threshold: float, last: int, seq_len: int,
                    channel: str) -> plt.Figure:
    """per_layer[layer] = mean receptive field per decay channel [C], over the ``last`` of ``seq_len``
    positions; ``cap`` = the largest possible (their mean position); ``channel`` names what a channel is."""
    fig, axes = _figure(1, 1, w=MIN_WIDTH, h=3.6)
    ax = axes[0, 0]
    for l in sorted(per_layer):
        rf = per_layer[l].numpy()
        ax.plot(np.arange(len(rf)), rf, marker="." if len(rf) <= 64 else None, lw=1,
                label=f"layer {l} (mean {rf.mean():.1f})")
    ax.axhline(cap, color="grey", ls="--", lw=1, label=f"whole prefix (mean position {cap:g})")
    over = f"all {seq_len} positions" if last >= seq_len else f"the last {last} of {seq_len} positions"
    _label(ax, channel, "receptive field (tokens)",
           f"Tokens back until the product of decays falls below {threshold:g}, mean over {over}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return fig


def usage(items: list) -> plt.Figure:
    """items = [dict(title, use [G, n], balanced [G, 1], choice (what one choice is), share (what the
    bar height is))]: bars = mean over groups (heads), whiskers = min..max over groups, dashed line =
    the balanced level."""
    widest = max(it["use"].shape[-1] for it in items)
    fig, axes = _figure(len(items), 1, w=min(14.0, 0.12 * widest + 3), h=2.8)
    for ax, it in zip(axes[:, 0], items):
        u = it["use"].reshape(-1, it["use"].shape[-1]).numpy()
        mean, lo, hi = u.mean(0), u.min(0), u.max(0)
        x = np.arange(u.shape[1])
        ax.bar(x, mean, color="tab:orange", alpha=0.75, width=0.8, label="mean over heads" if len(u) > 1 else None)
        if u.shape[0] > 1:
            ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], fmt="none", ecolor="k", lw=0.6, capsize=1.5,
                        label="min..max over heads")
        ax.axhline(float(it["balanced"].mean()), color="k", ls="--", lw=1, label="balanced use")
        _label(ax, it["choice"], it["share"], it["title"])
        ax.legend(fontsize=7)
    return fig
