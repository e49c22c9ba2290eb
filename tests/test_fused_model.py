"""The model with its elementwise chains as one op each (``sandbox.kernels.library.use_fused``: the residual norms,
SwiGLU, a linear mixer's output norm and gate) against the same model as torch's chains: the loss and every
parameter's gradient, for one model and for stacked replicas (vmap, as the training step stacks them).

On the CPU the ops run their torch form in float32, so this checks the wiring (which weights, epsilons, gates and
dtypes reach them, and the vmap rule) to float32 rounding. On a GPU they run the Triton kernels under bf16 autocast,
as the uncompiled training step does (run by ``benchmarks/device.sh checks``); there both bf16 paths are measured
against the float32 model and the fused one must be about as close to it as torch's chains are: the two round in
different places, and a bias's gradient, a sum over every token, moves by a few percent in either."""
import pytest
import torch

from sandbox.config import ModelConfig
from sandbox.model import LanguageModel

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MODELS = [("gla", "layernorm"), ("gla", "rmsnorm"), ("gated_deltanet", "layernorm")]


def use(fused: bool, monkeypatch) -> None:
    for where in ("sandbox.model.use_fused", "sandbox.mixers.linear.use_fused"):
        monkeypatch.setattr(where, lambda x: fused)


def loss_and_grads(models, tokens, bf16: bool):
    """Per-replica losses [R] and gradients {name: [R, ...]}; one model runs plainly, several stacked under vmap."""
    names = [n for n, _ in models[0].named_parameters()]
    params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_()
              for n in names}

    def loss_of(p, x):
        logits = torch.func.functional_call(models[0], p, (x[:, :-1],))
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())

    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=bf16):
        if len(models) == 1:
            losses = loss_of({n: p[0] for n, p in params.items()}, tokens)[None]
        else:
            losses = torch.func.vmap(loss_of, in_dims=(0, None))(params, tokens)
    grads = torch.autograd.grad(losses.sum(), list(params.values()))
    return losses.detach(), dict(zip(names, grads))


def relative(a, b) -> torch.Tensor:
    return (a - b).norm() / b.norm().clamp_min(1e-12)


def assert_as_close(got, plain, exact=None):
    """``got`` (fused) against ``plain`` (torch's chains): equal to float32 rounding where ``exact`` is None; in
    bf16, no further from ``exact`` (float32) than ``plain`` is, up to a factor of 2 per parameter and 1.5 over
    the whole gradient (a wiring error is off by order 1)."""
    (gl, gg), (pl, pg) = got, plain
    if exact is None:
        torch.testing.assert_close(gl, pl, rtol=1e-5, atol=1e-5)
        for name, g in pg.items():
            assert relative(gg[name], g) < 1e-5, name
        return
    el, eg = exact
    assert (gl - el).abs().max() <= 2 * (pl - el).abs().max() + 1e-3, (gl, pl, el)
    for name, g in eg.items():
        err, ref = relative(gg[name], g), relative(pg[name], g)
        assert err <= 2 * ref + 1e-3, f"{name}: relative error {err:.2e}, torch's chains {ref:.2e}"
    flat = {k: torch.cat([d[n].flatten() for n in eg]) for k, d in (("got", gg), ("plain", pg), ("exact", eg))}
    assert relative(flat["got"], flat["exact"]) <= 1.5 * relative(flat["plain"], flat["exact"]) + 1e-4


def build(mixer, norm, device, seeds=(0,)):
    cfg = ModelConfig(mixer=mixer, d_model=64, n_layers=2, n_heads=2, channel_mixer="swiglu", norm=norm)
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(LanguageModel(cfg, vocab_size=96, max_seq_len=40).to(device))
    tokens = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(1)).to(device)
    return models, tokens


def check(models, tokens, monkeypatch):
    bf16 = tokens.is_cuda
    use(False, monkeypatch)
    plain = loss_and_grads(models, tokens, bf16)
    exact = loss_and_grads(models, tokens, False) if bf16 else None
    use(True, monkeypatch)
    assert_as_close(loss_and_grads(models, tokens, bf16), plain, exact)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixer,norm", MODELS)
def test_the_fused_ops_give_the_models_loss_and_gradients(device, mixer, norm, monkeypatch):
    check(*build(mixer, norm, device), monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixer,norm", MODELS[:1] + MODELS[2:])
def test_the_fused_ops_under_vmap_give_each_replicas_loss_and_gradients(device, mixer, norm, monkeypatch):
    """Two replicas with weights of their own: each op's vmap rule must hand each replica its own weight."""
    check(*build(mixer, norm, device, seeds=(0, 1)), monkeypatch)
