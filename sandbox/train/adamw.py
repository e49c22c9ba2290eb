"""AdamW over the weights of R stacked replicas held in one [R, P] tensor, each replica clipped by its own norm.

Every weight of every replica lives in one row of ``flat`` ([R, P]; the weights that decay come first): replica
r's parameters are views of row r, so its model (evaluation, checkpoints, inspection) reads what the step trains,
and the step's forward takes each weight as an [R, ...] piece that ``weights()`` splits off ``flat``. The backward
of that split hands back the whole gradient as one [R, P] tensor, so clipping and the update are a few operations
over it (``update_``); compiled with the step they are a reduction for the replicas' norms and one pointwise
kernel that writes the weights and both moments. One fused torch AdamW per replica with ``clip_grad_norm_``
launched a few kernels per replica and weight, and the stacked forward copied every weight.

The arithmetic is ``torch.nn.utils.clip_grad_norm_`` followed by ``torch.optim.AdamW`` (tests/test_adamw.py holds
it to them in float64). A replica's moments read and write as a torch AdamW ``state_dict`` with two parameter
groups (the weights that decay, then the rest), the format of the runs' checkpoints.
"""
from __future__ import annotations

import functools
import math

import torch

EPS = 1e-8            # AdamW's default epsilon
CLIP_EPS = 1e-6       # clip_grad_norm_'s: coefficient max_norm / (norm + 1e-6)


def update_(flat, grad, norm, exp_avg, exp_avg_sq, lr, t, clip, *, betas, eps: float, weight_decay: float,
            decayed: int) -> None:
    """One clipped AdamW step of every row of ``flat`` in place. ``norm``: the rows of ``grad``'s norms; ``lr``,
    ``clip``: [R] (clip <= 0: none); ``t``: the step's number (from 1), a 0-dim tensor; the first ``decayed``
    columns decay by ``weight_decay``. (The norm comes in computed: Inductor's CPU code generation fails on the
    norm's reduction fused with the update, torch 2.13.)"""
    beta1, beta2 = betas
    dtype = flat.dtype
    coef = (clip / (norm + CLIP_EPS)).clamp(max=1.0)
    g = grad * torch.where(clip > 0, coef, torch.ones_like(coef)).to(dtype)[:, None]
    lr = lr.to(dtype)
    t = t.to(dtype)
    step_size = (lr / (1 - beta1 ** t))[:, None]
    bias2_sqrt = torch.sqrt(1 - beta2 ** t)
    if weight_decay and decayed:
        flat[:, :decayed].mul_((1 - lr * weight_decay)[:, None])
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(eps)
    flat.sub_(step_size * exp_avg / denom)


@functools.cache
def compiled_update(options: frozenset = frozenset()):
    """``update_`` through ``torch.compile`` with Inductor ``options`` (one compilation per shape, kept by
    Dynamo's cache)."""
    return torch.compile(update_, dynamic=False, options=dict(options))


class StackedAdamW:
    """The flat weights of ``models`` (one replica each, same architecture) and their AdamW state.

    ``lr``: an [R] tensor the owner fills before each ``step``; the train configs give the betas, the weight
    decay and each replica's gradient clipping.
    """

    def __init__(self, models: list, train_cfgs: list, lr: torch.Tensor):
        named = list(models[0].named_parameters())
        # torch's AdamW groups: the matrices (and other weights of 2 or more dims) decay, vectors do not
        self.names = [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]
        shapes = dict((n, p.shape) for n, p in named)
        self.shapes = [shapes[n] for n in self.names]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.groups = sum(1 for _, p in named if p.dim() >= 2)      # parameters in the decaying group
        self.decayed = sum(self.sizes[:self.groups])
        p0 = named[0][1]
        R, P = len(models), sum(self.sizes)
        flat = torch.empty(R, P, dtype=p0.dtype, device=p0.device)
        with torch.no_grad():
            for r, m in enumerate(models):
                params = dict(m.named_parameters())
                for name, piece, shape in zip(self.names, flat[r].split(self.sizes), self.shapes):
                    piece.copy_(params[name].reshape(-1))
                    params[name].data = piece.view(shape)
        self.flat = flat.requires_grad_()
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        c = train_cfgs[0]
        self.betas, self.weight_decay = tuple(c.betas), c.weight_decay
        self.clip = torch.tensor([tc.grad_clip for tc in train_cfgs], dtype=p0.dtype, device=p0.device)
        self.lr = lr
        self.update = update_

    def compile(self, options: dict | None = None) -> None:
        self.update = compiled_update(frozenset((options or {}).items()))

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight as an [R, ...] piece of ``flat`` (differentiable: the gradient comes back as [R, P])."""
        R = self.flat.shape[0]
        return {n: w.view(R, *s) for n, w, s in zip(self.names, self.flat.split(self.sizes, dim=1), self.shapes)}

    def step(self, grad: torch.Tensor, t: torch.Tensor) -> None:
        """Clip each replica's gradient ([R, P]) to its norm and take AdamW step number ``t`` (from 1)."""
        with torch.no_grad():
            norm = torch.linalg.vector_norm(grad, dim=1)
            self.update(self.flat, grad, norm, self.exp_avg, self.exp_avg_sq, self.lr, t, self.clip, betas=self.betas,
                        eps=EPS, weight_decay=self.weight_decay, decayed=self.decayed)

    # -- one replica's state, as torch's AdamW holds it ----------------------------------------
    def state_dict(self, r: int, steps_taken: int, device=None) -> dict:
        """Replica r's moments as ``torch.optim.AdamW(...).state_dict()`` after ``steps_taken`` steps (copies, on
        ``device``: default the weights')."""
        def pieces(t):
            row = t[r].detach().to(device or t.device, copy=True)          # one copy of the row, then its views
            return [p.view(s) for p, s in zip(row.split(self.sizes), self.shapes)]

        step = torch.tensor(float(steps_taken))
        state = {i: {"step": step.clone(), "exp_avg": m, "exp_avg_sq": v}
                 for i, (m, v) in enumerate(zip(pieces(self.exp_avg), pieces(self.exp_avg_sq)))}
        n = len(self.names)
        common = {"betas": self.betas, "eps": EPS, "amsgrad": False, "maximize": False, "foreach": None,
                  "capturable": False, "differentiable": False, "fused": True, "decoupled_weight_decay": True}
        groups = [{"lr": float(self.lr[r]), "weight_decay": self.weight_decay, **common,
                   "params": list(range(self.groups))},
                  {"lr": float(self.lr[r]), "weight_decay": 0.0, **common, "params": list(range(self.groups, n))}]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, r: int, sd: dict) -> None:
        """Replica r's moments from a torch AdamW ``state_dict`` of the same two groups (a checkpoint's)."""
        n = len(self.names)
        sizes = [len(g["params"]) for g in sd["param_groups"]]
        if sizes != [self.groups, n - self.groups]:
            raise ValueError(f"optimizer state: groups of {sizes} parameters, expected "
                             f"{[self.groups, n - self.groups]}")
        order = [i for g in sd["param_groups"] for i in g["params"]]
        with torch.no_grad():
            for t, key in ((self.exp_avg, "exp_avg"), (self.exp_avg_sq, "exp_avg_sq")):
                for piece, i in zip(t[r].split(self.sizes), order):
                    st = sd["state"].get(i)
                    piece.copy_(st[key].reshape(-1) if st else torch.zeros_like(piece))
