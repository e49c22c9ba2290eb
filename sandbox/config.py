"""Run configuration: YAML -> validated dataclasses.

Every error is a ``ConfigError`` whose message is one line naming the source (file
or ``--set``), the dotted key and the reason; the CLI prints it and exits with 2.
"""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sandbox.mixers import mixer_config_class, mixer_names
from sandbox.recipes import RECIPES, apply_recipe
from sandbox.tasks import task_config_class, task_names


class ConfigError(Exception):
    """A bad configuration; ``str(err)`` is the one-line message for the user."""

    def __init__(self, source: str, key: str, reason: str):
        self.source, self.key, self.reason = source, key, reason
        super().__init__(f"{source}: {key}: {reason}" if key else f"{source}: {reason}")


@dataclass
class ModelConfig:
    mixer: str | list[str] = "attention"      # one name, or one per layer (a pattern repeated to n_layers)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 1
    channel_mixer: Literal["swiglu", "none"] = "swiglu"
    mlp_expand: float = 2.0                   # SwiGLU hidden width = mlp_expand * d_model
    positions: Literal["none", "learned"] = "none"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    dropout: float = 0.0                      # on the embeddings and on attention weights, in training only
    # model.<mixer name>: options of that mixer, parsed into its registered config class
    mixer_options: dict[str, Any] = field(default_factory=dict)

    def layer_mixers(self) -> list[str]:
        pattern = [self.mixer] if isinstance(self.mixer, str) else list(self.mixer)
        return [pattern[i % len(pattern)] for i in range(self.n_layers)]

    def options(self, name: str):
        return self.mixer_options.get(name) or mixer_config_class(name)()


@dataclass
class TrainConfig:
    recipe: str | None = None                 # a named recipe filling the keys left unset (sandbox/recipes.py)
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batch_size: int = 512
    early_stop: float | None = 0.99           # stop once validation accuracy reaches this; null = never
    log_every: int = 25
    device: str = "auto"                      # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16", "fp64"] = "auto"   # auto = bf16 autocast on CUDA; fp64: references
    # replay forward+backward as a CUDA graph; auto = on CUDA when every mixer is graph_safe()
    cuda_graph: bool | Literal["auto"] = "auto"
    # torch.compile the forward and backward (fuses norms, residuals, SwiGLU, gate arithmetic) from the first
    # step; auto = on CUDA where the run is long enough to earn the compilation back (train/compile.py: decide)
    compile: bool | Literal["auto"] = "auto"


@dataclass
class TaskSpec:
    name: str
    params: Any                               # the task's own config dataclass


@dataclass
class RunConfig:
    task: TaskSpec
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    name: str | None = None


# ---- generic strict parsing ------------------------------------------------------------

def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp, value, key: str, src: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        alts = typing.get_args(tp)
        if value is None:
            if type(None) in alts:
                return None
            raise ConfigError(src, key, "must not be null")
        errors = []
        for alt in alts:
            if alt is type(None):
                continue
            try:
                return _coerce(alt, value, key, src)
            except ConfigError as e:
                errors.append(e.reason)
        raise ConfigError(src, key, " or ".join(dict.fromkeys(errors)))
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(src, key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(src, key, f"expected a list, got {value!r}")
        if not value:
            raise ConfigError(src, key, "must not be an empty list")
        return [_coerce(item, v, f"{key}[{i}]", src) for i, v in enumerate(value)]
    if origin is dict or tp is Any:
        return value
    if value is None:
        raise ConfigError(src, key, "must not be null")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(src, key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(src, key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(src, key, f"expected a number, got {value!r}")
        try:
            return float(value)          # YAML reads 1e-3 (no dot) as a string
        except (TypeError, ValueError):
            raise ConfigError(src, key, f"expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(src, key, f"expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return parse_dataclass(tp, value, key, src)
    raise ConfigError(src, key, f"unsupported type {_type_name(tp)}")


def parse_dataclass(cls, data, where: str, src: str, skip=()):
    """Build ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(src, where, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(src, dotted, f"unknown key (known: {', '.join(names)})")
        kwargs[key] = _coerce(hints[key], value, dotted, src)
    try:
        return cls(**kwargs)
    except ValueError as e:                      # __post_init__ says "field: reason"
        fld, sep, reason = str(e).partition(": ")
        if sep and fld.replace(".", "").replace("_", "").isalnum() and " " not in fld:
            raise ConfigError(src, f"{where}.{fld}" if where else fld, reason) from None
        raise ConfigError(src, where, str(e)) from None


def _parse_model(data, src: str) -> ModelConfig:
    data = dict(data or {})
    if not isinstance(data, dict):
        raise ConfigError(src, "model", "expected a mapping")
    options = {}
    for name in mixer_names():
        if name in data:
            options[name] = parse_dataclass(mixer_config_class(name), data.pop(name), f"model.{name}", src)
    if "mixer_options" in data:
        raise ConfigError(src, "model.mixer_options", "write mixer options as model.<mixer name>")
    cfg = parse_dataclass(ModelConfig, data, "model", src, skip=("mixer_options",))
    cfg.mixer_options = options
    pattern = [cfg.mixer] if isinstance(cfg.mixer, str) else cfg.mixer
    for i, name in enumerate(pattern):
        if name not in mixer_names():
            key = "model.mixer" if isinstance(cfg.mixer, str) else f"model.mixer[{i}]"
            raise ConfigError(src, key, f"unknown mixer {name!r} (known: {', '.join(mixer_names())})")
    for key, val, lo in (("d_model", cfg.d_model, 1), ("n_layers", cfg.n_layers, 1), ("n_heads", cfg.n_heads, 1)):
        if val < lo:
            raise ConfigError(src, f"model.{key}", f"must be >= {lo}, got {val}")
    if cfg.d_model % cfg.n_heads:
        raise ConfigError(src, "model.n_heads", f"{cfg.n_heads} does not divide d_model {cfg.d_model}")
    if not isinstance(cfg.mixer, str) and cfg.n_layers % len(cfg.mixer):
        raise ConfigError(src, "model.mixer", f"a pattern of {len(cfg.mixer)} mixers does not tile "
                                              f"n_layers={cfg.n_layers}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(src, "model.dropout", f"must be in [0, 1), got {cfg.dropout}")
    if cfg.mlp_expand <= 0:
        raise ConfigError(src, "model.mlp_expand", f"must be > 0, got {cfg.mlp_expand}")
    return cfg


def _parse_train(data, src: str) -> TrainConfig:
    cfg = parse_dataclass(TrainConfig, data, "train", src)
    for key in ("steps", "batch_size", "eval_every", "eval_batch_size", "log_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(src, f"train.{key}", f"must be >= 1, got {getattr(cfg, key)}")
    if not cfg.lr > 0:
        raise ConfigError(src, "train.lr", f"must be > 0, got {cfg.lr}")
    if not 0 <= cfg.warmup_frac < 1:
        raise ConfigError(src, "train.warmup_frac", f"must be in [0, 1), got {cfg.warmup_frac}")
    if len(cfg.betas) != 2 or not all(0 <= b < 1 for b in cfg.betas):
        raise ConfigError(src, "train.betas", f"must be two numbers in [0, 1), got {cfg.betas}")
    if cfg.early_stop is not None and not 0 < cfg.early_stop <= 1:
        raise ConfigError(src, "train.early_stop", f"must be in (0, 1] or null, got {cfg.early_stop}")
    dev = cfg.device
    if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ConfigError(src, "train.device", f"must be auto, cpu, cuda or cuda:N; got {dev!r}")
    return cfg


def _parse_task(data, src: str) -> TaskSpec:
    if not isinstance(data, dict):
        raise ConfigError(src, "task", "expected a mapping with at least `name`")
    data = dict(data)
    name = data.pop("name", None)
    if name not in task_names():
        raise ConfigError(src, "task.name", f"unknown task {name!r} (known: {', '.join(task_names())})")
    return TaskSpec(name, parse_dataclass(task_config_class(name), data, "task", src))


def config_from_dict(data: dict, src: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(src, "", "the top level must be a mapping with task, model and train sections")
    known = {"task", "model", "train", "seed", "name"}
    for key in data:
        if key not in known:
            raise ConfigError(src, str(key), f"unknown key (known: {', '.join(sorted(known))})")
    if "task" not in data:
        raise ConfigError(src, "task", "missing (a run needs a task)")
    if not isinstance(data.get("train") or {}, dict):
        raise ConfigError(src, "train", "expected a mapping")
    try:
        data = apply_recipe(data)
    except KeyError as e:
        raise ConfigError(src, "train.recipe", f"unknown recipe {e.args[0]!r} (known: {', '.join(sorted(RECIPES))})") \
            from None
    seed = _coerce(int, data.get("seed", 0), "seed", src)
    name = _coerce(str | None, data.get("name"), "name", src)
    cfg = RunConfig(task=_parse_task(data["task"], src), model=_parse_model(data.get("model"), src),
                    train=_parse_train(data.get("train"), src), seed=seed, name=name)
    mixers = cfg.model.layer_mixers()
    if cfg.model.positions == "learned" and cfg.task.params.seq_len < 1:
        raise ConfigError(src, "task.seq_len", "learned positions need a positive seq_len")
    for m in set(mixers):
        check = getattr(mixer_config_class(m), "check_model", None)
        if check is not None:                 # a mixer may reject combinations with the model shape
            try:
                check(cfg.model.options(m), cfg.model)
            except ValueError as e:
                fld, _, reason = str(e).partition(": ")
                raise ConfigError(src, f"model.{m}.{fld}", reason) from None
    return cfg


def read_yaml(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "", "no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(str(path), "", f"malformed YAML at {where}: {getattr(e, 'problem', e)}") from None
    return {} if data is None else data


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError("--set", text, "expected KEY=VALUE, e.g. model.d_model=128")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def set_dotted(data: dict, key: str, value, src: str = "--set") -> None:
    """Set ``a.b.c`` in a nested dict, creating mappings on the way."""
    parts = key.split(".")
    node = data
    for i, p in enumerate(parts[:-1]):
        nxt = node.setdefault(p, {})
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(src, ".".join(parts[: i + 1]), "is not a section, cannot set a key inside it")
        node = nxt
    node[parts[-1]] = value


def load_config(path=None, overrides=(), data: dict | None = None) -> RunConfig:
    """Read a YAML file (or a dict), apply ``KEY=VALUE`` overrides, validate. An error about a key that an
    override set (or a key inside it) names ``--set``, not the file: the file did not say that; any other
    error names the file and the overrides it was read with."""
    src = str(path) if path is not None else "<config>"
    raw = read_yaml(path) if path is not None else copy.deepcopy(data or {})
    if not isinstance(raw, dict):
        raise ConfigError(src, "", "the top level must be a mapping with task, model and train sections")
    overridden = {}
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        set_dotted(raw, key, value)
        overridden[key] = item if isinstance(item, str) else f"{key}={value}"
    try:
        return config_from_dict(raw, src)
    except ConfigError as e:
        if any(e.key == k or e.key.startswith((k + ".", k + "[")) for k in overridden):
            raise ConfigError("--set", e.key, e.reason) from None
        if overridden:
            raise ConfigError(f"{src} with --set {' '.join(overridden.values())}", e.key, e.reason) from None
        raise


def to_dict(cfg) -> dict:
    """Plain nested dict of a config (mixer options under model.<name>, task params under task)."""
    if isinstance(cfg, RunConfig):
        model = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k != "mixer_options"}
        model.update({n: dataclasses.asdict(o) for n, o in cfg.model.mixer_options.items()})
        return {"name": cfg.name, "seed": cfg.seed,
                "task": {"name": cfg.task.name, **dataclasses.asdict(cfg.task.params)},
                "model": model, "train": dataclasses.asdict(cfg.train)}
    return dataclasses.asdict(cfg)


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
