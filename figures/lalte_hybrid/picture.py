"""The figure's picture: recall against G / w, one line per row, with 95% intervals over seeds.

    python figures/lalte_hybrid/picture.py SWEEP_DIR OUT.png

Left: every row's test accuracy (the learning rate and step chosen per seed on val), the verdict's cells. Right,
once ``score_twice.py`` has written ``lte_eval.csv``: the LTE rows' weights at the chosen step through the capped
cache (solid) and with the training mask (dotted). Intervals are t intervals of the mean over seeds, clipped to [0, 1]
(``sandbox.analysis.stats.mean_ci``); one seed draws the mean alone. The dashed lines mark laLTE's window w and
GDN+SWA's w + b; the grey line is the task's chance.
"""
from __future__ import annotations

import sys
from pathlib import Path

from sandbox.analysis.plots import save
from sandbox.analysis.stats import mean_ci
from sandbox.analysis.verdicts.claims import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from score_twice import figure  # noqa: E402


def _line(ax, xs, cells, label, color, style="-"):
    """Means with their 95% intervals at ``xs`` (cells: one list of per-seed values per x, or None)."""
    points = [(x, mean_ci(v, bounds=(0.0, 1.0))) for x, v in zip(xs, cells) if v]
    if not points:
        return
    x = [p for p, _ in points]
    m = [c[0] for _, c in points]
    ax.plot(x, m, style, marker="o", ms=4, color=color, label=label)
    lo = [c[1] if c[1] == c[1] else c[0] for _, c in points]      # NaN (one seed): no interval
    hi = [c[2] if c[2] == c[2] else c[0] for _, c in points]
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)


def draw(sweep_dir, out) -> Path:
    import matplotlib.pyplot as plt

    fig_code, t = figure(), Table(sweep_dir)
    w, pairs, gaps = fig_code.geometry(t)
    rows = fig_code.rows(pairs)
    swa = t.spec["base"]["model"]["swa"]["window"]
    xs = [g / w for g in gaps.values()]
    scores = fig_code.capped_scores(t)
    panels = 2 if scores else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.4), squeeze=False, dpi=110)
    colors = plt.get_cmap("tab10")
    for i, (label, where) in enumerate(rows.items()):
        cells = [t.cell(**where, **{"task.distance": g}) for g in gaps.values()]
        _line(axes[0, 0], xs, [c.values if c else None for c in cells], label, colors(i))
        if scores and label in fig_code.lte_rows(pairs):
            for key, style, name in (("capped_accuracy", "-", "capped cache"), ("mask_accuracy", ":", "mask")):
                vals = [[float(r[key]) for r in scores if r["row"] == label and int(r["G"]) == g]
                        for g in gaps.values()]
                _line(axes[0, 1], xs, vals, f"{label}, {name}", colors(i), style)
    titles = ["test accuracy (training forward; lr and step chosen on val)", "LTE rows: capped cache and mask"]
    for ax, title in zip(axes[0], titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.axhline(t.chance, color="grey", lw=0.8)
        ax.axvline(1.0, color="k", ls="--", lw=0.8)
        ax.axvline(swa / w, color="k", ls=":", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(f"G / w  (w = {w}; dashed: w, dotted: the SWA window {swa})")
        ax.set_ylabel("recall (MQAR accuracy)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"laLTE Table 2 analogue: queries G tokens behind their {pairs} pairs, mean and 95% interval "
                 "over seeds", fontsize=10)
    save(fig, out)
    plt.close(fig)
    return Path(out)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python figures/lalte_hybrid/picture.py SWEEP_DIR OUT.png", file=sys.stderr)
        return 2
    print(f"wrote {draw(*args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
