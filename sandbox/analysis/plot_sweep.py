"""``sandbox plot``: the papers' curves from a sweep directory.

Rows come from ``SWEEP_DIR/results.csv`` (one row per trial, config keys as dotted columns,
written by ``sandbox sweep``) or, when that file is absent, from every
``SWEEP_DIR/**/result.json`` (the run's config flattened to dotted keys plus its result
fields; ``test/accuracy`` there means ``best_accuracy``, ``test/loss`` the lowest test loss).

Aggregation, per point of the plot (panel ``--col`` x line ``--hue`` x ``--x`` [x ``--heatmap``]):
first the best ``--y`` over every other varying config key (the tuned keys, e.g. train.lr;
they are printed) separately for each seed, then mean and spread over seeds.
"""
from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path

import yaml

from sandbox.analysis.plots import save, suptitle
from sandbox.analysis.stats import mean_ci
from sandbox.config import flatten
from sandbox.train.record import SUMMARY_FIELDS, RunResult

RESULT_FIELDS = (*SUMMARY_FIELDS, "objective")     # a row's result columns (the rest are config keys)
# test accuracy means the test accuracy at the step chosen on val where runs have a val split (as the verdicts read
# it), else the best test accuracy of runs from before the split
Y_ALIASES = {"test/accuracy": ("test_at_best_val", "test/accuracy", "best_accuracy", "objective"),
             "accuracy": ("best_accuracy", "objective"),
             "test/final_accuracy": ("test/final_accuracy", "final_accuracy"),
             "test/loss": ("test/loss", "objective")}      # a loss sweep's objective is its test loss


def _value(text):
    if text is None:
        return None
    if not isinstance(text, str):
        return text
    if text == "" or text in ("None", "null", "nan", "NaN"):
        return None
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, bool, str)) else text


def load_rows(sweep_dir) -> tuple[list[dict], str]:
    """Rows of a sweep (results.csv, else */result.json) and a word on where they came from."""
    d = Path(sweep_dir)
    if not d.is_dir():
        raise ValueError(f"sweep_dir: {d} is not a directory")
    csv_path = d / "results.csv"
    if csv_path.is_file():
        with csv_path.open(newline="") as f:
            rows = [{k: _value(v) for k, v in r.items()} for r in csv.DictReader(f)]
        return rows, str(csv_path)
    rows = []
    for path in sorted(d.glob("**/result.json")):
        try:
            res = RunResult.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        row = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
               for k, v in flatten(res.config or {}).items()}
        row.update(res.summary())
        row["test/accuracy"] = res.best_accuracy
        row["test/final_accuracy"] = res.final_accuracy
        losses = [h["test/loss"] for h in res.history or [] if number(h.get("test/loss")) is not None]
        row["test/loss"] = min(losses) if losses else None
        row["run_dir"] = str(path.parent)
        rows.append(row)
    if not rows:
        raise ValueError(f"sweep_dir: {d} has neither results.csv nor any */result.json")
    return rows, f"{len(rows)} result.json files under {d}"


# what a trial that ran to its end (or was stopped by the sweep's rule) records: results.csv's states, then
# result.json's; a failed trial's row carries an accuracy of 0 and an interrupted one its value so far
FINISHED = {"complete", "pruned", "completed", "early_stopped", "stopped"}


def finished(rows: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The rows of trials that finished (rows without a status kept), and a count of the others by status."""
    from collections import Counter
    left = Counter(str(r["status"]) for r in rows if r.get("status") is not None and r["status"] not in FINISHED)
    return [r for r in rows if r.get("status") is None or r["status"] in FINISHED], dict(left)


def number(v) -> float | None:
    """A results value as a finite float (None: missing, not a number, a flag, or infinite)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _key(v):
    """Sort key mixing numbers and strings."""
    n = number(v)
    return (0, n, "") if n is not None else (1, 0.0, str(v))


def aggregate(rows: list[dict], y: str, axes: list[str], seed_key: str = "seed", lower_is_better: bool = False):
    """``{axis values: stats}`` with stats = mean, std, min, max, seeds, trials, and the list of
    keys the best was taken over."""
    cols = set().union(*(r.keys() for r in rows)) if rows else set()
    for a in axes:
        if a not in cols:
            near = sorted(c for c in cols if a.split(".")[-1] in c)[:5]
            raise ValueError(f"{a}: no such column in the sweep results" + (f" (similar: {', '.join(near)})" if near else ""))
    pick = min if lower_is_better else max
    scored = [r for r in rows if number(r.get(y)) is not None]
    per_seed = _group_by(scored, [*axes, seed_key])                 # the best of each: over the tuned keys
    skip = set(axes) | {seed_key, y, "run_dir", "name", *RESULT_FIELDS}
    tuned = {c for g in per_seed.values() if len(g) > 1 for c in cols - skip
             if "." in c and len({str(r.get(c)) for r in g}) > 1}
    out = {}
    for groups in _group_by(list(per_seed.values()), axes, first=True).values():   # then over seeds
        vals = [_chosen(g, y, pick) for g in groups]
        _, lo, hi = mean_ci(vals, bounds=(0.0, 1.0) if "accuracy" in y or y == "test_at_best_val" else None)
        out[tuple(groups[0][0].get(a) for a in axes)] = {
            "mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "ci_low": lo, "ci_high": hi, "seeds": len(vals),
            "trials": sum(map(len, groups))}
    return out, sorted(tuned)


def _band(s: dict, spread: str) -> tuple[float, float]:
    """The band drawn around a point: over seeds min..max, mean ± sd, or the mean's 95% interval (the point alone
    while one seed gives none)."""
    if spread == "minmax":
        return s["min"], s["max"]
    if spread == "std":
        return s["mean"] - s["std"], s["mean"] + s["std"]
    lo, hi = s["ci_low"], s["ci_high"]
    return (s["mean"], s["mean"]) if lo != lo else (lo, hi)


def _chosen(group: list[dict], y: str, pick) -> float:
    """A seed's value over its tuned trials: at the trial chosen on val for the test accuracy at the val-chosen step
    (the verdicts' reading), else the best of ``y``."""
    if y == "test_at_best_val":
        return number(max(group, key=lambda r: number(r.get("best_val_accuracy")) or 0.0)[y])
    return pick(number(r[y]) for r in group)


def _group_by(items: list, keys: list[str], first: bool = False) -> dict[tuple, list]:
    """Rows (or, with ``first``, groups of rows, by their first row) grouped by their values of ``keys``."""
    out: dict[tuple, list] = {}
    for item in items:
        row = item[0] if first else item
        out.setdefault(tuple(str(row.get(k)) for k in keys), []).append(item)
    return out


def _resolve_y(rows: list[dict], y: str) -> str:
    cols = set().union(*(r.keys() for r in rows))
    for c in (y, *Y_ALIASES.get(y, ())):
        if c in cols and any(number(r.get(c)) is not None for r in rows):
            return c
    numeric = sorted(c for c in cols if any(number(r.get(c)) is not None for r in rows) and "." not in c)
    raise ValueError(f"y: no numeric column {y!r} in the sweep results (numeric result columns: {', '.join(numeric)})")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def _filter(rows: list[dict], where: list[str]) -> list[dict]:
    for cond in where:
        key, sep, raw = cond.partition("=")
        if not sep:
            raise ValueError(f"where: expected KEY=VALUE, got {cond!r}")
        want = _value(raw)
        rows = [r for r in rows if r.get(key) == want or str(r.get(key)) == raw]
    if not rows:
        raise ValueError(f"where: no rows left after {', '.join(where)}")
    return rows


def plot_sweep(sweep_dir, x: str, y: str = "test/accuracy", hue: str | None = None, col: str | None = None,
               heatmap: str | None = None, spread: str = "minmax", out=None, where=(), logx: bool | None = None,
               log=print) -> dict:
    """Draw curves (or heatmaps) and print the table; returns the aggregated points. ``logx``: a log x axis;
    None = for a learning rate and for numbers spanning a factor of 8 or more."""
    import matplotlib.pyplot as plt

    if spread not in ("minmax", "std", "ci"):
        raise ValueError(f"spread: must be minmax, std or ci, got {spread!r}")
    if heatmap and hue:
        raise ValueError("hue: a heatmap has no lines; use --col or --where to split it")
    rows, source = load_rows(sweep_dir)
    rows, unfinished = finished(_filter(rows, list(where)))
    if unfinished:
        log(f"left out {sum(unfinished.values())} trials that did not finish ("
            + ", ".join(f"{n} {s}" for s, n in sorted(unfinished.items(), key=lambda kv: -kv[1])) + ")")
    ycol = _resolve_y(rows, y)
    axes = [a for a in (col, hue, heatmap, x) if a]
    lower = "loss" in ycol or "loss" in y
    points, tuned = aggregate(rows, ycol, axes, lower_is_better=lower)
    if not points:
        raise ValueError(f"y: no row has a value for {ycol}")
    log(f"{source}: {len(rows)} trials, y = {ycol}" + (f" ({'lowest' if lower else 'best'} over "
                                                         f"{', '.join(tuned)} per seed)" if tuned else ""))
    # the table
    head = [a for a in axes] + ["mean", "min", "max", "std", "seeds", "trials"]
    table = [[str(k[i]) for i in range(len(axes))] + [f"{s['mean']:.4f}", f"{s['min']:.4f}", f"{s['max']:.4f}",
                                                       f"{s['std']:.4f}", str(s["seeds"]), str(s["trials"])]
             for k, s in sorted(points.items(), key=lambda kv: [_key(v) for v in kv[0]])]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(head)]
    log("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in table:
        log("  ".join(c.ljust(w) for c, w in zip(r, widths)))

    fig = draw(points, axes, x, ycol, tuned, hue=hue, col=col, heatmap=heatmap, spread=spread, logx=logx)
    if out is None:
        name = f"{_slug(ycol)}_vs_{_slug(x)}" + (f"_by_{_slug(heatmap)}" if heatmap else "") \
               + (f"_hue_{_slug(hue)}" if hue else "") + (f"_col_{_slug(col)}" if col else "")
        out = Path(sweep_dir) / "plots" / f"{name}.png"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, out)
    plt.close(fig)
    log(f"wrote {out}")
    return {"points": points, "tuned": tuned, "y": ycol, "path": str(out)}


def draw(points: dict, axes: list[str], x: str, ycol: str, tuned: list[str], *, hue=None, col=None, heatmap=None,
         spread: str = "minmax", logx: bool | None = None):
    """The figure of aggregated points: one panel per ``col`` value; a line per ``hue`` value over a
    numeric x, or markers with error bars (side by side, not joined) over categories such as mixer
    names; or a heatmap of ``heatmap`` against x."""
    import numpy as np
    import matplotlib.pyplot as plt

    def values_of(i):
        return sorted({k[i] for k in points}, key=_key)

    panels = values_of(0) if col else [None]
    xs = values_of(len(axes) - 1)
    numeric_x = all(number(v) is not None for v in xs)
    rate = x.split(".")[-1] == "lr"            # learning rates are tried on a log grid
    if logx and not (heatmap is None and numeric_x and min(number(v) for v in xs) > 0):
        raise ValueError(f"logx: needs positive numbers on a line plot; {x} has {', '.join(map(str, xs))}")
    fig, axs = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + (1 if heatmap else 0), 3.8),
                            squeeze=False, dpi=100)
    for pi, pv in enumerate(panels):
        ax = axs[0, pi]
        sub = {k: s for k, s in points.items() if not col or k[0] == pv}
        if heatmap:
            hi = axes.index(heatmap)
            hv = values_of(hi)
            grid = np.full((len(hv), len(xs)), np.nan)
            for k, s in sub.items():
                grid[hv.index(k[hi]), xs.index(k[-1])] = s["mean"]
            im = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
            for (r, c), v in np.ndenumerate(grid):
                if not np.isnan(v):
                    ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="w" if v < np.nanmean(grid) else "k")
            ax.set_xticks(range(len(xs)), [str(v) for v in xs])
            ax.set_yticks(range(len(hv)), [str(v) for v in hv])
            ax.set_ylabel(heatmap)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03).set_label(ycol)
        else:
            hues = values_of(axes.index(hue)) if hue else [None]
            for j, hv in enumerate(hues):
                line = sorted(((k[-1], s) for k, s in sub.items() if not hue or k[axes.index(hue)] == hv),
                              key=lambda t: _key(t[0]))
                if not line:
                    continue
                m = np.array([s["mean"] for _, s in line])
                lo = np.array([_band(s, spread)[0] for _, s in line])
                hi_ = np.array([_band(s, spread)[1] for _, s in line])
                label = str(hv) if hue else None
                color = f"C{j % 10}"    # by the value's place among all panels' values: one colour per value
                if numeric_x:
                    px = [number(v) for v, _ in line]
                    ax.plot(px, m, marker="o", ms=4, label=label, color=color)
                    ax.fill_between(px, lo, hi_, alpha=0.2, color=color)
                else:       # categories: nothing lies between two of them, so no line joins them
                    dodge = (j - (len(hues) - 1) / 2) * min(0.15, 0.6 / len(hues))
                    px = [xs.index(v) + dodge for v, _ in line]
                    ax.errorbar(px, m, yerr=[m - lo, hi_ - m], fmt="o", ms=4, capsize=3, label=label, color=color)
            if numeric_x:
                nx = [number(v) for v in xs]
                if logx or (logx is None and min(nx) > 0 and (rate or max(nx) / min(nx) >= 8)):
                    ax.set_xscale("log", base=10 if rate else 2)
                ax.set_xticks(nx, [str(v) for v in xs])
                ax.minorticks_off()
            else:
                ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30 if len(xs) > 4 else 0)
                ax.set_xlim(-0.5, len(xs) - 0.5)
            ax.set_ylabel(ycol)
            if "accuracy" in ycol:      # one scale in every panel: chance and ceiling look the same everywhere
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            if hue:
                ax.legend(title=hue, fontsize=7, title_fontsize=7)
        ax.set_xlabel(x)
        if col:
            ax.set_title(f"{col} = {pv}", fontsize=9)
    band = {"minmax": "min..max", "std": "±1 std", "ci": "95% t interval"}[spread]
    per_seed = (f"test accuracy at the {', '.join(tuned) or 'trial'} and step chosen on val" if ycol == "test_at_best_val"
                else f"{ycol}: best over {', '.join(tuned) or 'trials'}")
    suptitle(fig, f"{per_seed} per seed; mean"
             + ("" if heatmap else f" and {band}") + " over seeds", fontsize=9)
    fig.tight_layout()
    return fig
