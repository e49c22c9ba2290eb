"""The mixer interface and the name -> class registry.

A mixer maps ``[batch, seq, d_model] -> [batch, seq, d_model]``. Each registered
mixer names a config dataclass; the YAML section ``model.<mixer name>`` is parsed
into it, so every mixer owns its fields and the loader validates them strictly.

Optional extras a mixer may override:
  * ``aux_loss()``  -> scalar tensor added to the training loss (balance losses, penalties), the term of
    the last forward handed over once (a second call gives None): a stack of replicas reads it under vmap,
    and a vmapped tensor left on the module would escape the compiled step (Inductor cannot take it);
  * ``state_size(seq_len)`` -> recurrent state size in elements per sequence;
  * ``forward_at(x, positions)`` -> the output at a few rows only, ``[batch, P, d_model]`` (the last layer,
    under a head that reads P positions): by default the whole output, then those rows; a mixer whose
    output ends in per-token work does that work on the P rows alone;
  * ``eager_reason()`` -> None when a training step with this mixer may be compiled, captured as a CUDA graph
    and stacked (``graph_safe()``), else why not in one line (``train.cuda_graph: true`` prints it);
  * capture: while ``self.capture`` is a dict, ``forward`` stores analysis tensors in it
    (``keys``, ``values``, ``routing``, ``final_state``, ``gates`` ...) without changing
    the computation. ``record(name, tensor)`` does the bookkeeping.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from sandbox.kernels.linear import linear


@dataclass(frozen=True)
class MixerContext:
    """What every mixer is told about its place in the model."""

    d_model: int
    n_heads: int
    layer_idx: int
    max_seq_len: int
    dropout: float = 0.0          # the model's dropout, for mixers with attention weights to drop


class Mixer(nn.Module):
    """Base class: holds the context and the capture hook."""

    def __init__(self, ctx: MixerContext, cfg):
        super().__init__()
        self.ctx = ctx
        self.cfg = cfg
        self.capture: dict | None = None

    def record(self, name: str, value: torch.Tensor) -> None:
        """Store a detached copy for analysis when capturing; a no-op otherwise."""
        if self.capture is not None:
            self.capture[name] = value.detach()

    def aux_loss(self) -> torch.Tensor | None:
        return None

    def forward_at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``self(x)`` at ``positions`` (int64 ``[B, P]``) only."""
        return gather_rows(self(x), positions)

    def graph_safe(self) -> bool:
        """Whether forward and backward keep static shapes and never wait on the host, so a
        training step can be captured as a CUDA graph and its replicas stacked
        (``sandbox/train/step.py``). Off unless a mixer has been checked."""
        return self.eager_reason() is None

    def eager_reason(self) -> str | None:
        """Why a training step with this mixer stays eager, in one line; None where it is graph-safe."""
        return "not checked for static shapes and host reads"

    def state_size(self, seq_len: int) -> int:
        """Elements of recurrent state per sequence (attention: its KV cache)."""
        return 2 * seq_len * self.ctx.d_model


@dataclass
class NoConfig:
    """For mixers without options of their own."""


_REGISTRY: dict[str, tuple[type[Mixer], type]] = {}


def register(name: str, config_cls: type = NoConfig) -> Callable[[type[Mixer]], type[Mixer]]:
    """Class decorator: ``@register("gla", GLAConfig)``."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"config class for mixer {name!r} must be a dataclass")

    def deco(cls: type[Mixer]) -> type[Mixer]:
        if name in _REGISTRY:
            raise ValueError(f"mixer {name!r} registered twice")
        _REGISTRY[name] = (cls, config_cls)
        cls.mixer_name = name
        return cls

    return deco


class Linear(nn.Linear):
    """``nn.Linear`` whose weight gradient, in a stack of replicas, is summed over runs of tokens
    (``sandbox.kernels.linear``): the layer every mixer and the channel mixer project with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def gather_rows(t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``t[b, positions[b]]`` for ``t`` of shape ``[B, T, ...]``: ``[B, P, ...]``."""
    idx = positions.view(*positions.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:])
    return t.gather(1, idx)


def mixer_names() -> list[str]:
    return sorted(_REGISTRY)


def mixer_config_class(name: str) -> type:
    return _REGISTRY[name][1]


def build_mixer(name: str, ctx: MixerContext, cfg=None) -> Mixer:
    cls, config_cls = _REGISTRY[name]
    return cls(ctx, cfg if cfg is not None else config_cls())
