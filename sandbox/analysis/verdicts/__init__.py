"""``sandbox verdict SWEEP_DIR [SWEEP_DIR ...]``: a figure's claims judged by the criteria fixed before it ran (from
one directory, or from its parts' directories pooled).

A figure is a folder of its own (``figures/NAME/``): its README states the claims and the criteria, fixed before
any trial ran; its sweep files carry the study's ``name``; its ``verdict.py`` computes the criteria and exposes
``CLAIMS``, the functions of a :class:`Table` that each return a :class:`Claim`, and, where the figure has state
pictures, ``PICTURE_RUNS`` ({study name: ((variant, {grid key: value}), ...)}) and ``PICTURE_SEEDS``. The library
names no figure; a sweep directory finds its figure's code

- in itself or in the folder above it (``figures/NAME/`` holds its committed runs one folder down, e.g.
  ``figures/NAME/run/``),
- else beside the sweep file it was started from (``sweep.json``'s ``source``, which ``sandbox sweep`` writes),
- or where ``figure`` says (``--figure figures/NAME``).

A figure's ``verdict.py`` may also name its positive control (``CONTROL``, a function of the table returning a
:class:`Control`), printed first. The terms the figures share (cells chosen on validation, comparisons with 95%
intervals against rules fixed before running, Holm over a claim's items, planning seeds) are ``claims.py``'s and
``sandbox/analysis/stats.py``'s.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import yaml

from sandbox.analysis.verdicts.checks import budget_check
from sandbox.analysis.verdicts.claims import FOOTNOTE, Cell, Claim, Control, Table

__all__ = ["Cell", "Claim", "Control", "Table", "figure_folder", "picture_runs", "report", "runs_of", "verdicts"]


def figure_folder(sweep_dir, figure=None) -> Path:
    """The folder holding the figure code of ``sweep_dir`` (see the module's docstring for where it is looked for)."""
    if figure is not None:
        folder = Path(figure)
        if not (folder / "verdict.py").is_file():
            raise ValueError(f"figure: {folder} has no verdict.py (a figure folder is figures/NAME/)")
        return folder
    d = Path(sweep_dir)
    for folder in (d, d.resolve().parent):
        if (folder / "verdict.py").is_file():
            return folder
    source = _sweep_source(d)
    if source is not None and (source.parent / "verdict.py").is_file():
        return source.parent
    raise ValueError(f"sweep_dir: {d} has no figure code: no verdict.py in it or the folder above it, nor beside its "
                     f"sweep file ({source or 'sweep.json names none'}); pass --figure figures/NAME")


def _sweep_source(sweep_dir: Path) -> Path | None:
    """The sweep file a sweep directory was started from, as ``sandbox sweep`` recorded it (relative paths are
    taken from the current directory, as they were given)."""
    meta = sweep_dir / "sweep.json"
    if not meta.is_file():
        return None
    source = json.loads(meta.read_text()).get("source")
    return Path(source) if source else None


def _load(folder: Path, study: str, sweep_dir="a sweep directory") -> ModuleType:
    """The figure's ``verdict.py``, loaded by path, once its sweep files are found to name ``study``."""
    studies = {yaml.safe_load(p.read_text()).get("name") for p in sorted(folder.glob("*.yaml"))}
    if study not in studies:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {study!r}, but the sweep files of {folder} name "
                         f"{', '.join(sorted(map(str, studies))) or 'no study'}")
    path = (folder / "verdict.py").resolve()
    if path not in _MODULES:
        # registered under a name of its own while it runs (dataclasses and pickling look modules up by name)
        spec = importlib.util.spec_from_file_location(f"_figure{len(_MODULES)}_{folder.resolve().name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        if not getattr(module, "CLAIMS", None):
            raise ValueError(f"{path}: defines no CLAIMS (the figure's claim functions)")
        _MODULES[path] = module
    return _MODULES[path]


_MODULES: dict[Path, ModuleType] = {}


def runs_of(path) -> list[Path]:
    """The sweep directories ``path`` stands for: itself, or, for a figure folder, its runs one folder down (one
    sweep directory each)."""
    d = Path(path)
    if (d / "sweep.yaml").is_file() or not d.is_dir():
        return [d]
    runs = sorted(p.parent for p in d.glob("*/sweep.yaml"))
    if not runs and (d / "verdict.py").is_file():
        parts = sorted(d.glob("*.yaml"), key=lambda f: ("control" not in f.name, f.name))     # the control first
        files = " then ".join(f"`sandbox sweep {f}`" for f in parts) or "its sweep files"
        raise ValueError(f"sweep_dir: the figure {d} has no run yet (no folder in it holds a sweep.yaml): run "
                         f"{files}, then `sandbox verdict` on the sweep directory")
    return runs or [d]


def protocols(runs: list[Path]) -> list[list[Path]]:
    """Runs grouped by protocol: one study name and one base config. Runs of one protocol (its parts, or a rerun
    with more seeds) pool as one table, in the order given (a seed found in two keeps the first one's); runs of
    different protocols (a pilot, a variant without conv) are judged apart."""
    groups: dict[str, list[Path]] = {}
    for r in runs:
        spec = yaml.safe_load((r / "sweep.yaml").read_text()) if (r / "sweep.yaml").is_file() else {}
        key = json.dumps([spec.get("name"), spec.get("base")], sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def verdicts(*sweep_dirs, figure=None) -> list[Claim]:
    return judge(*sweep_dirs, figure=figure)[1]


def judge(*sweep_dirs, figure=None) -> tuple[Control | None, list[Claim]]:
    """The figure's control (None where its verdict.py names none) and claims, on the pooled directories."""
    t = Table(*sweep_dirs)
    module = _load(figure_folder(t.dir, figure), t.name, t.dir)
    control = getattr(module, "CONTROL", None)
    return (control(t) if control else None), [f(t) for f in module.CLAIMS]


def report(*paths, figure=None, plan: bool = False, power: float = 0.8) -> str:
    """What ``sandbox verdict`` prints: per protocol (a figure folder's runs pool where they are runs of one protocol,
    ``protocols``, and are judged apart otherwise), the control, the recipe's budget check (``checks.py``) and each
    claim with its rule, cells, effects, intervals and verdict; with ``plan``, the seeds each comparison needs at
    ``power`` from the run's spreads as a pilot."""
    runs = runs_of(paths[0]) if len(paths) == 1 else [Path(p) for p in paths]
    groups = protocols(runs) if len(paths) == 1 and len(runs) > 1 else [runs]
    out = []
    for group in groups:
        control, claims = judge(*group, figure=figure)
        parts = [f"## {' + '.join(r.name for r in group)}"] if len(groups) > 1 else []
        if plan:
            parts += [c.plan_markdown(power) for c in claims]
            parts.append(f"Seeds per cell for a {power:.0%} chance that the rule holds when the true effect is the "
                         "expected one, at the measured spreads (unknown: planned at sd 0.5, the most an accuracy "
                         "can spread), at the level Holm tests a claim's first item; GPU-minutes: those seeds in "
                         "every cell of the item, at what a seed of each took in the pilot.")
        else:
            check = budget_check(Table(*group))
            parts += [x for x in (control.markdown() if control else None, check) if x]
            parts += [c.markdown() for c in claims]
            parts.append(FOOTNOTE)
        out.append("\n\n".join(parts))
    return "\n\n".join(out)


def picture_runs(sweep_dir, figure=None) -> list[tuple[str, int, Path | None]]:
    """(variant, seed, run directory or None while that cell has no finished trial) of a figure's state pictures:
    per variant of the figure's ``PICTURE_RUNS`` and seed, the run of the best learning rate."""
    t = Table(Path(sweep_dir))
    folder = figure_folder(t.dir, figure)
    module = _load(folder, t.name, t.dir)
    runs = getattr(module, "PICTURE_RUNS", {})
    if t.name not in runs:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {t.name!r}, for which {folder}/verdict.py names no "
                         f"state pictures (PICTURE_RUNS)")
    seeds = module.PICTURE_SEEDS
    out = []
    for variant, where in runs[t.name]:
        best = t.best_rows(**where)
        for seed in range(seeds):
            row = best.get(seed)
            out.append((variant, seed, row["sweep_dir"] / row["run_dir"] if row and row.get("run_dir") else None))
    return out
