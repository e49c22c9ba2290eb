"""The model with its elementwise chains as one op each (``sandbox.kernels.library.use_fused``: the residual norms,
SwiGLU, a linear mixer's output norm and gate) against the same model as torch's chains: the loss and every
parameter's gradient.

On the CPU the ops run their torch form, so this checks the wiring (which weights, epsilons, gates and dtypes reach
them); on a GPU they run the Triton kernels under bf16 autocast, as the uncompiled training step does (run by
``benchmarks/device.sh checks``)."""
import pytest
import torch

from sandbox.config import ModelConfig
from sandbox.model import LanguageModel

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def loss_and_grads(model, tokens, fused: bool, monkeypatch):
    for where in ("sandbox.model.use_fused", "sandbox.mixers.linear.use_fused"):
        monkeypatch.setattr(where, lambda x: fused and not torch._C._functorch.is_batchedtensor(x))
    model.zero_grad()
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=tokens.is_cuda):
        logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixer,norm", [("gla", "layernorm"), ("gla", "rmsnorm"), ("gated_deltanet", "layernorm")])
def test_the_fused_ops_give_the_models_loss_and_gradients(device, mixer, norm, monkeypatch):
    torch.manual_seed(0)
    cfg = ModelConfig(mixer=mixer, d_model=64, n_layers=2, n_heads=2, channel_mixer="swiglu", norm=norm)
    model = LanguageModel(cfg, vocab_size=96, max_seq_len=40).to(device)
    tokens = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(1)).to(device)
    plain, want = loss_and_grads(model, tokens, False, monkeypatch)
    fused, got = loss_and_grads(model, tokens, True, monkeypatch)
    # float32 on the CPU: the same sums in another order; bf16 on a GPU: one rounding moved per chain
    tol = 1e-5 if device == "cpu" else 2e-2
    torch.testing.assert_close(fused, plain, rtol=tol, atol=tol)
    for name, g in want.items():
        err = (got[name] - g).norm() / g.norm().clamp_min(1e-12)
        assert err < tol, f"{name}: relative error {err:.2e}"
