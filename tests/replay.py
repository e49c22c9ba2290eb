"""Shared test helper: one replayed CUDA-graph step against the same step run outside the graph."""
import torch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def replay_gap(step, state: list, batch) -> tuple[float, float]:
    """Replay ``step`` on ``batch``, then restore ``state`` (every tensor the step changes) and run the step's
    own function on the same stream. Returns (how far the replay moved the weights, the largest relative gap
    between the replay's state and the unreplayed step's)."""
    before = [t.clone() for t in state]
    step(*batch)
    torch.cuda.synchronize()
    replayed = [t.clone() for t in state]
    with torch.no_grad():
        for t, b in zip(state, before):
            t.copy_(b)
    step.stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(step.stream):
        step._step(*batch)
    torch.cuda.synchronize()
    return _rel(replayed[0], before[0]), max(_rel(r, e) for r, e in zip(replayed, state))
