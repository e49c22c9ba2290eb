"""Accuracy and loss on a task's held-out splits, validation and test: of one model (``evaluate``), or of every
replica of a stack at once (``evaluate_stack``), the replicas run as one stacked forward per batch as in the step
(eager: a run reads its held-out splits a dozen times), so an evaluation costs one replica's launches, not R of them.
Validation chooses (the best step, the learning rate, early stopping); test is what verdicts read.

Both count the same way: the logits at the scored positions, the argmax against the target, and the summed loss
(the training loss op, ``cross_entropy``) over the scored targets.
"""
from __future__ import annotations

import torch

from sandbox.kernels.cross_entropy import IGNORE, cross_entropy
from sandbox.train.step import scored_positions

# The most logits a stacked evaluation holds at once, all replicas together (bf16: 2 GB)
EVAL_LOGITS = 1 << 30


def _count(counts: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
    """Add to ``counts`` ([R, 3]: correct, scored, summed loss) those of ``logits`` [R, rows, P, V] against
    ``y`` [R, rows, P]."""
    R = counts.shape[0]
    mask = y != IGNORE
    nll = cross_entropy(logits.flatten(0, -2), y.flatten())
    counts += torch.stack([((logits.argmax(-1) == y) & mask).flatten(1).sum(1).double(),
                           mask.flatten(1).sum(1).double(), nll.view(R, -1).sum(1).double()], 1)


SPLITS = ("val", "test")


def _metrics(counts: torch.Tensor, split: str) -> list[dict]:
    correct, scored, loss = counts.unbind(1)
    return [{f"{split}/accuracy": c / max(n, 1.0), f"{split}/loss": s / max(n, 1.0)}
            for c, n, s in zip(correct.tolist(), scored.tolist(), loss.tolist())]


@torch.no_grad()
def evaluate(model, task, batch_size: int, autocast, splits=SPLITS) -> dict:
    """One model's accuracy and loss on each held-out split (``autocast``: the context to run its forward in)."""
    model.eval()
    out = {}
    try:
        for split in splits:
            counts = torch.zeros(1, 3, dtype=torch.float64, device=task.device)
            for x, y in task.eval_batches(split, batch_size):
                pos, y = scored_positions(y, task.max_targets)
                with autocast():
                    logits = model(x, pos)
                _count(counts, logits[None], y[None])
            out.update(_metrics(counts, split)[0])
    finally:
        model.train()
    return out


@torch.no_grad()
def evaluate_stack(step, tasks: list, batch_size: int, splits=SPLITS) -> list[dict]:
    """Accuracy and loss of every replica of ``step`` (a ``Step``) on each held-out split of its task (``tasks[r]``).
    Replicas of one seed share their batches ([B, T]); of several, each reads its own ([R, B, T]). A batch goes
    through in slices of rows whose logits of all replicas stay within ``EVAL_LOGITS`` elements."""
    base, R = step.models[0], step.R
    params = {n: p.detach() for n, p in step.optimizer.weights().items()}
    buffers = {n: torch.stack(bs) for n, bs in zip(step.buffer_names, zip(*(m.buffers() for m in step.models)))}
    shared = len({t.seed for t in tasks}) == 1          # a stack's tasks differ in nothing but the seed
    dim = None if shared else 0

    def logits_of(p, b, x, pos):
        return torch.func.functional_call(base, (p, b), (x, pos))

    def forward(x, pos):                                  # [R, rows, P, V]
        if R == 1:                                        # as the step: no vmap for one replica
            return base(x, pos)[None]
        return torch.func.vmap(logits_of, in_dims=(0, 0, dim, None if pos is None else dim))(params, buffers, x, pos)

    def count(split: str) -> torch.Tensor:
        counts = torch.zeros(R, 3, dtype=torch.float64, device=step.device)
        for got in zip(*[t.eval_batches(split, batch_size) for t in (tasks[:1] if shared else tasks)]):
            x, y = (torch.stack(ts) for ts in zip(*got))      # [1 or R, B, T]
            pos, y = scored_positions(y.flatten(0, 1), step.per_row)
            y = y.view(x.shape[0], x.shape[1], -1)
            pos = None if pos is None else pos.view_as(y)
            if shared:
                x, pos = x[0], None if pos is None else pos[0]
            rows = max(1, EVAL_LOGITS // (R * y.shape[-1] * base.embed.num_embeddings))
            for i in range(0, y.shape[1], rows):
                cut = slice(i, i + rows)
                xi, pi = (x[cut], None if pos is None else pos[cut]) if shared else \
                    (x[:, cut], None if pos is None else pos[:, cut])
                logits = forward(xi, pi)
                _count(counts, logits, y[:, cut].expand(logits.shape[:-1]))
        return counts

    out: list[dict] = [{} for _ in range(R)]
    base.eval()
    try:
        with step.attention_backends(), step.autocast():
            for split in splits:
                for r, m in enumerate(_metrics(count(split), split)):
                    out[r].update(m)
    finally:
        base.train()
    return out
