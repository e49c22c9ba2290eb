"""Sweep YAML -> a validated ``SweepSpec`` and the list of its trial points.

A sweep file has a base run config, grid axes, tuned keys, an objective and optional
pruning (see docs/sweeps.md). Every grid point (and every tuned value or range end)
is turned into a run config and validated with the run-config parser before anything
runs, so a bad point fails the whole sweep at once with a one-line
``ConfigError`` naming the file and the key.

Words: a *grid point* is one combination of the grid's values; a *trial* is one run of it
with one set of tuned values (and, for sampled ranges, one sample index). A ``Point`` below
is what one trial runs: the grid values, the tuned values and the sample index;
``point_id`` (a hash of the three; the name is kept, as the studies and results files of
earlier sweeps hold it) identifies it in the Optuna study so that each is enqueued exactly
once, and ``grid_id`` groups the trials of one grid point (best over the tuned keys,
per-point pruning).

In the study every grid and tuned value is an Optuna parameter with its distribution
(``SweepSpec.distributions``), so Optuna's own tools (``trials_dataframe``,
``optuna.visualization``, optuna-dashboard) read a sweep: a grid axis is categorical over
its values, a tuned key of floats is a float range (log where every value is positive).
Optuna's categorical choices are None, bool, int, float or str: a list value (a layer
pattern such as ``[gla, attention]``) is stored as its JSON text and read back as the list
(``param_value``, ``from_param``).

``load_sweep(path, overrides)`` applies ``--set KEY=VALUE`` to the base config; the study
of such a variant is named after the sweep and a hash of its overrides, so that it never
mixes with the sweep's own study.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandbox.config import (ConfigError, RunConfig, config_from_dict, flatten, parse_dataclass, parse_override,
                            read_yaml, set_dotted, to_dict)
from sandbox.recipes import recipe_fills

TOP_KEYS = ("name", "base", "grid", "tune", "objective", "pruning")
METRICS = ("val/accuracy", "val/loss", "test/accuracy", "test/loss")
RANGE_KEYS = ("low", "high", "log", "trials")


@dataclass
class Objective:
    # what chooses among a point's learning rates and prunes them: the validation split, so that test is read once
    metric: Literal["val/accuracy", "val/loss", "test/accuracy", "test/loss"] = "val/accuracy"
    mode: Literal["best", "final"] = "best"            # best evaluation of the run, or the last one
    direction: Literal["maximize", "minimize"] | None = None   # default: maximize accuracy, minimize loss

    def __post_init__(self):
        if self.direction is None:
            self.direction = "minimize" if self.metric.endswith("/loss") else "maximize"


@dataclass
class Pruning:
    median: bool = True          # stop a trial whose metric is below the median of its grid point's trials
    warmup_evals: int = 1        # evaluations a trial always gets before it can be pruned
    min_trials: int = 2          # finished trials of the same grid point needed before pruning starts

    def __post_init__(self):
        if self.warmup_evals < 0:
            raise ValueError(f"warmup_evals: must be >= 0, got {self.warmup_evals}")
        if self.min_trials < 1:
            raise ValueError(f"min_trials: must be >= 1, got {self.min_trials}")


@dataclass
class Range:
    low: float
    high: float
    log: bool = False
    trials: int = 1


@dataclass
class Point:
    """What one trial runs: a grid point's values with one set of tuned values."""
    grid: dict[str, Any]          # dotted key -> value
    tune: dict[str, Any]          # dotted key -> value (listed or sampled)
    sample: int | None            # index of the sampled value set (ranges only)
    grid_id: str
    point_id: str

    def label(self, keys=None) -> str:
        items = {**self.grid, **self.tune}
        return " ".join(f"{k}={_fmt(v)}" for k, v in items.items() if keys is None or k in keys) or "(base)"

    def params(self) -> dict[str, Any]:
        """The values as Optuna parameters (``param_value``)."""
        return {k: param_value(v) for k, v in {**self.grid, **self.tune}.items()}


def param_value(value):
    """A config value as an Optuna parameter value: as it is, or, for a list or mapping, its JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def from_param(value):
    """The config value of an Optuna parameter value (``param_value`` undone)."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, (list, dict)):
            return decoded
    return value


@dataclass
class SweepSpec:
    name: str
    source: str
    base: dict                                  # plain nested dict of the validated base config
    axes: list[tuple[list[str], list[list]]]    # (keys, rows of values); a zipped axis has several keys
    tune_lists: dict[str, list] = field(default_factory=dict)
    tune_ranges: dict[str, Range] = field(default_factory=dict)
    objective: Objective = field(default_factory=Objective)
    pruning: Pruning | None = None
    overrides: list[str] = field(default_factory=list)     # --set KEY=VALUE applied to the base
    _points: list[Point] | None = field(default=None, repr=False, compare=False)

    @property
    def grid_keys(self) -> list[str]:
        return [k for keys, _ in self.axes for k in keys]

    @property
    def tune_keys(self) -> list[str]:
        return [*self.tune_lists, *self.tune_ranges]

    @property
    def samples(self) -> int | None:
        return next(iter(self.tune_ranges.values())).trials if self.tune_ranges else None

    def fingerprint(self) -> dict:
        """What must not change when a sweep directory or study is resumed."""
        return {"base": self.base, "objective": dict(vars(self.objective)),
                "pruning": dict(vars(self.pruning)) if self.pruning else None}

    @property
    def grid_points(self) -> int:
        return math.prod(len(rows) for _, rows in self.axes)

    def points(self) -> list[Point]:
        """What every trial runs, in YAML order (the last grid axis varies fastest, tuned values
        vary within a grid point)."""
        if self._points is None:
            self._points = self._make_points()
        return self._points

    def _make_points(self) -> list[Point]:
        out = []
        for combo in itertools.product(*[rows for _, rows in self.axes]):
            grid = {k: v for (keys, _), row in zip(self.axes, combo) for k, v in zip(keys, row)}
            grid = canonical(self.base, grid)
            grid_id = _hash({"grid": grid})
            sampled = self._sample(grid_id)
            for listed in itertools.product(*self.tune_lists.values()):
                tune = canonical(self.base, dict(zip(self.tune_lists, listed)))
                for s, values in enumerate(sampled or [None]):
                    t = {**tune, **(values or {})}
                    ident = {"grid": grid, "tune": tune, "sample": None if values is None else s}
                    out.append(Point(grid, t, ident["sample"], grid_id, _hash(ident)))
        return out

    def distributions(self) -> dict:
        """Each grid and tuned key's Optuna distribution, over the values its trials take (see the module
        docstring)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution

        values: dict[str, dict] = {}
        for p in self.points():
            for k, v in {**p.grid, **p.tune}.items():
                values.setdefault(k, {}).setdefault(json.dumps(v, sort_keys=True), v)
        out = {}
        for k, seen in values.items():
            vs = list(seen.values())
            if k in self.tune_keys and all(isinstance(v, float) for v in vs):
                r = self.tune_ranges.get(k)
                low, high = (min(*vs, r.low), max(*vs, r.high)) if r else (min(vs), max(vs))
                out[k] = FloatDistribution(low, high, log=r.log if r else low > 0)
            else:
                out[k] = CategoricalDistribution([param_value(v) for v in vs])
        return out

    def _sample(self, grid_id: str) -> list[dict] | None:
        """Stratified values of the tuned ranges for one grid point: the range (in log space
        if ``log``) is cut into ``trials`` equal slices, each slice gets one value drawn
        uniformly inside it, and the slices of different keys are shuffled against each
        other (a Latin hypercube). Seeded by the sweep name and grid point, so a resumed
        sweep enqueues exactly the same values."""
        if not self.tune_ranges:
            return None
        n = self.samples
        rng = random.Random(f"{self.name}/{grid_id}")
        cols = {}
        for key, r in self.tune_ranges.items():
            order = list(range(n))
            rng.shuffle(order)
            lo, hi = (math.log(r.low), math.log(r.high)) if r.log else (r.low, r.high)
            vals = [lo + (hi - lo) * (i + rng.random()) / n for i in order]
            cols[key] = [float(f"{(math.exp(v) if r.log else v):.4g}") for v in vals]
        return [{k: cols[k][i] for k in cols} for i in range(n)]

    def point_config(self, point: Point) -> RunConfig:
        return build_config(self.base, {**point.grid, **point.tune}, self.source)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def _hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def build_config(base: dict, values: dict, src: str = "<sweep>") -> RunConfig:
    data = copy.deepcopy(base)
    for key, value in values.items():
        set_dotted(data, key, value, src)
    return config_from_dict(data, src)


def canonical(base: dict, values: dict) -> dict:
    """The values as the run config reads them (e.g. the string "1e-3" becomes 0.001)."""
    if not values:
        return {}
    flat = flatten(to_dict(build_config(base, values)))
    return {k: flat.get(k, v) for k, v in values.items()}


def _point_error(src: str, where: str, err: ConfigError) -> ConfigError:
    return ConfigError(src, where, f"{err.key}: {err.reason}" if err.key and err.key != where.split(".", 1)[-1]
                       else err.reason)


def load_sweep(path, overrides=()) -> SweepSpec:
    """Read and validate a sweep file, with ``--set KEY=VALUE`` overrides of its base config; every error is a
    one-line ``ConfigError`` (naming ``--set`` for an override's)."""
    path = Path(path)
    src = str(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(src, "", "a sweep file is a mapping with base, grid, tune, objective")
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(src, str(key), f"unknown key (known: {', '.join(TOP_KEYS)})")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(src, "name", f"must be a plain name (letters, digits, . _ -), got {name!r}")

    base_raw = raw.get("base")
    if isinstance(base_raw, str):                    # a path to a run YAML, relative to the sweep file
        base_raw = read_yaml(path.parent / base_raw)
    if not isinstance(base_raw, dict):
        raise ConfigError(src, "base", "missing: a run config (task, model, train) or the path of one")
    base = _parse_base(base_raw, list(overrides), raw, src)
    if overrides:       # a variant: its own study, never mixed with the sweep's (the same --set resumes it)
        name = f"{name}-set-{_hash(sorted(overrides))[:6]}"

    axes = _parse_grid(raw.get("grid"), src)
    tune_lists, tune_ranges = _parse_tune(raw.get("tune"), src)
    grid_keys = [k for keys, _ in axes for k in keys]
    for key in [*grid_keys, *tune_lists, *tune_ranges]:
        if key == "name":
            raise ConfigError(src, key, "the sweep names its trials itself; `name` cannot be swept")
    for key in [*tune_lists, *tune_ranges]:
        if key in grid_keys:
            raise ConfigError(src, f"tune.{key}", "is also a grid axis; a key is either a grid axis or tuned")

    # every key on its own, so that an unknown key is named as such (other errors may depend
    # on the rest of the point and are reported with the whole point below) ...
    singles = [(f"grid.{k}", k, row[j]) for keys, rows in axes for j, k in enumerate(keys) for row in rows]
    singles += [(f"tune.{k}", k, v) for k, values in tune_lists.items() for v in values]
    singles += [(f"tune.{k}.{e}", k, getattr(r, e)) for k, r in tune_ranges.items() for e in ("low", "high")]
    for where, key, value in singles:
        try:
            build_config(base, {key: value}, src)
        except ConfigError as e:
            if e.reason.startswith(("unknown key", "unknown mixer", "is not a section", "expected a")):
                raise _point_error(src, where, e) from None
    for key, r in tune_ranges.items():
        try:
            kind = flatten(to_dict(build_config(base, {key: r.low}, src))).get(key)
        except ConfigError:
            continue                                  # reported with its point below
        if not isinstance(kind, float):
            raise ConfigError(src, f"tune.{key}", "a range needs a float config key; list the values instead")

    objective = _parse_section(Objective, raw.get("objective"), "objective", src)
    pruning = _parse_section(Pruning, raw["pruning"], "pruning", src) if raw.get("pruning") is not None else None
    if pruning is not None and not pruning.median:
        pruning = None
    spec = SweepSpec(name, src, base, axes, tune_lists, tune_ranges, objective, pruning, list(overrides))

    # ... then every combination (a grid value may be valid alone but not with another)
    lists = list(itertools.product(*tune_lists.values())) or [()]
    ends = [{k: getattr(r, e) for k, r in tune_ranges.items()} for e in ("low", "high")] if tune_ranges else [{}]
    for combo in itertools.product(*[rows for _, rows in axes]):
        grid = {k: v for (keys, _), row in zip(axes, combo) for k, v in zip(keys, row)}
        for listed in lists:
            for extra in ends:
                values = {**grid, **dict(zip(tune_lists, listed)), **extra}
                cfg = _check(base, values, src, "grid point " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
                if cfg.train.device.startswith("cuda:"):
                    raise ConfigError(src, "train.device", "a sweep places trials on GPUs itself (one "
                                      "CUDA_VISIBLE_DEVICES per worker); use auto, cuda or cpu")
    return spec


def _parse_base(base_raw: dict, overrides: list[str], raw: dict, src: str) -> dict:
    """The validated base config, with the overrides applied: a plain nested dict."""
    data = copy.deepcopy(base_raw)
    swept = {str(k).strip() for axis in (raw.get("grid") or {}) for k in str(axis).split(",")} | \
        {str(k) for k in (raw.get("tune") or {})}
    given = {}
    for item in overrides:
        key, value = parse_override(item)
        if key in swept:
            raise ConfigError("--set", item, f"{key} is a grid or tuned key of {src}; the sweep sets it per trial")
        set_dotted(data, key, value, "--set")
        given[key] = item
    try:
        cfg = config_from_dict(data, src)
    except ConfigError as e:
        item = next((given[k] for k in given if (e.key or "") == k or (e.key or "").startswith(k + ".")), None)
        if item is not None:
            raise ConfigError("--set", item, e.reason) from None
        raise ConfigError(src, f"base.{e.key}" if e.key else "base", e.reason) from None
    base = to_dict(cfg)
    base["name"] = None
    # a recipe's values depend on the point (Zoology's batch on its seq_len): leave them for each point to fill
    for section, values in recipe_fills(data).items():
        for key in values:
            base[section].pop(key, None)
    return base


def _check(base: dict, values: dict, src: str, where: str) -> RunConfig:
    try:
        return build_config(base, values, src)
    except ConfigError as e:
        if where.startswith("grid point"):
            raise ConfigError(src, where, f"{e.key}: {e.reason}" if e.key else e.reason) from None
        raise _point_error(src, where, e) from None


def _parse_section(cls, data, where: str, src: str):
    try:
        return parse_dataclass(cls, data, where, src)
    except TypeError as e:                            # a required field is missing
        raise ConfigError(src, where, str(e)) from None


def _parse_grid(data, src: str) -> list[tuple[list[str], list[list]]]:
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ConfigError(src, "grid", "expected a mapping of config keys to lists of values")
    axes, seen = [], set()
    for raw_key, values in data.items():
        where = f"grid.{raw_key}"
        keys = [k.strip() for k in str(raw_key).split(",")]
        if not all(keys):
            raise ConfigError(src, where, "empty key in a zipped axis (write `a.b, c.d: [[x, y], ...]`)")
        for k in keys:
            if k in seen:
                raise ConfigError(src, where, f"{k} appears in two grid axes")
            seen.add(k)
        if not isinstance(values, list):
            raise ConfigError(src, where, f"expected a list of values, got {values!r}")
        if not values:
            raise ConfigError(src, where, "empty axis (give at least one value)")
        if len(keys) == 1:
            rows = [[v] for v in values]
        else:
            rows = values
            for i, row in enumerate(rows):
                if not isinstance(row, list) or len(row) != len(keys):
                    raise ConfigError(src, f"{where}[{i}]", f"a zipped axis of {len(keys)} keys needs rows of "
                                      f"{len(keys)} values, got {row!r}")
        if len({json.dumps(r, sort_keys=True, default=str) for r in rows}) != len(rows):
            raise ConfigError(src, where, "repeats a value (each grid point runs once)")
        axes.append((keys, rows))
    return axes


def _parse_tune(data, src: str) -> tuple[dict[str, list], dict[str, Range]]:
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(src, "tune", "expected a mapping of config keys to a list or {low, high, log, trials}")
    lists, ranges = {}, {}
    for key, spec in data.items():
        where = f"tune.{key}"
        if isinstance(spec, list):
            if not spec:
                raise ConfigError(src, where, "empty list (give at least one value)")
            if len({json.dumps(v, sort_keys=True, default=str) for v in spec}) != len(spec):
                raise ConfigError(src, where, "repeats a value")
            lists[key] = spec
        elif isinstance(spec, dict):
            for k in spec:
                if k not in RANGE_KEYS:
                    raise ConfigError(src, f"{where}.{k}", f"unknown key (known: {', '.join(RANGE_KEYS)})")
            for k in ("low", "high"):
                if k not in spec:
                    raise ConfigError(src, f"{where}.{k}", "missing (a range needs low and high)")
            r = parse_dataclass(Range, spec, where, src)
            if not r.low < r.high:
                raise ConfigError(src, f"{where}.high", f"must be > low ({r.low:g}), got {r.high:g}")
            if r.log and r.low <= 0:
                raise ConfigError(src, f"{where}.low", f"a log range needs low > 0, got {r.low:g}")
            if r.trials < 1:
                raise ConfigError(src, f"{where}.trials", f"the trial budget must be >= 1, got {r.trials}")
            ranges[key] = r
        else:
            raise ConfigError(src, where, f"expected a list of values or {{low, high, log, trials}}, got {spec!r}")
    budgets = {r.trials for r in ranges.values()}
    if len(budgets) > 1:
        raise ConfigError(src, "tune", f"all ranges share one trial budget (sampled together); got {sorted(budgets)}")
    return lists, ranges
