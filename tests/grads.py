"""Shared test helper: output, input gradient and parameter gradients of a module."""


def run(m, x, w, fn=None):
    """Forward ``m`` (or ``fn(m, x)``) on a copy of ``x``, backpropagate ``sum(y * w)``."""
    xi = x.clone().requires_grad_(True)
    m.zero_grad()
    y = m(xi) if fn is None else fn(m, xi)
    (y * w).sum().backward()
    return y.detach(), xi.grad, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
