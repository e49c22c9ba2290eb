"""The stacked AdamW (one [R, P] tensor of weights) against torch's clip_grad_norm_ and AdamW, one replica at a time."""
import copy

import torch

from sandbox.train.adamw import StackedAdamW


class Tiny(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a = torch.nn.Linear(5, 7)
        self.norm = torch.nn.LayerNorm(7)
        self.b = torch.nn.Linear(7, 3, bias=False)
        self.conv = torch.nn.Parameter(torch.randn(4, 2, 3))


class Cfg:
    def __init__(self, clip, betas=(0.9, 0.98), weight_decay=0.1):
        self.grad_clip, self.betas, self.weight_decay = clip, betas, weight_decay


def _reference(model, cfg):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=1.0, betas=cfg.betas, foreach=False)


def _grads_of(opt, r, grad):
    """Row r of an [R, P] gradient as a dict of parameter-shaped pieces, by name."""
    return {n: g.view(s) for n, g, s in zip(opt.names, grad[r].split(opt.sizes), opt.shapes)}


def test_each_replica_steps_as_torch_clip_and_adamw_would_step_it_alone():
    """Three replicas, learning rates and clips of their own (one clipped hard, one never, one not at all),
    six steps of random gradients: float64 weights and moments equal torch's to rounding."""
    lrs, clips = [1e-2, 3e-3, 5e-2], [0.05, 1e9, 0.0]
    models = [Tiny(s).double() for s in range(3)]
    refs = [copy.deepcopy(m) for m in models]
    cfgs = [Cfg(c) for c in clips]
    lr = torch.tensor(lrs, dtype=torch.float32)
    opt = StackedAdamW(models, cfgs, lr)
    ref_opts = [_reference(m, c) for m, c in zip(refs, cfgs)]
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 7):
        grad = torch.randn(opt.flat.shape, dtype=torch.float64, generator=gen)
        for r, (ref, ropt) in enumerate(zip(refs, ref_opts)):
            pieces = _grads_of(opt, r, grad)
            for n, p in ref.named_parameters():
                p.grad = pieces[n].clone()
            if clips[r] > 0:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), clips[r], foreach=False)
            for group in ropt.param_groups:
                group["lr"] = float(lr[r])
            ropt.step()
        opt.step(grad, torch.tensor(t))
    for r, (m, ref) in enumerate(zip(models, refs)):
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=f"replica {r}: {n}")
        ref_state = ref_opts[r].state_dict()["state"]
        for i, st in opt.state_dict(r, 6)["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(st[key], ref_state[i][key], rtol=1e-12, atol=1e-18)
            assert float(st["step"]) == float(ref_state[i]["step"]) == 6.0
    # the clips were replicas' own: the hard-clipped replica's first moment is a fraction of the others'
    norms = opt.exp_avg.norm(dim=1)
    assert norms[0] < 0.05 * norms[1] and norms[0] < 0.05 * norms[2]


def test_a_replicas_state_goes_to_torchs_adamw_and_back():
    """A replica's state_dict loads into a torch AdamW, which then steps as the stack does; a torch AdamW
    state_dict (the checkpoints' format before the stack held the weights) loads into another replica."""
    models = [Tiny(s).double() for s in range(2)]
    lr = torch.tensor([1e-2, 1e-2], dtype=torch.float32)
    opt = StackedAdamW(models, [Cfg(0.0), Cfg(0.0)], lr)
    gen = torch.Generator().manual_seed(1)
    for t in range(1, 4):
        opt.step(torch.randn(opt.flat.shape, dtype=torch.float64, generator=gen), torch.tensor(t))
    # replica 0 -> torch, one more step each way
    ref = copy.deepcopy(models[0])
    ropt = _reference(ref, Cfg(0.0))
    ropt.load_state_dict(opt.state_dict(0, 3))
    for group in ropt.param_groups:
        group["lr"] = float(lr[0])
    grad = torch.randn(opt.flat.shape, dtype=torch.float64, generator=gen)
    pieces = _grads_of(opt, 0, grad)
    for n, p in ref.named_parameters():
        p.grad = pieces[n].clone()
    ropt.step()
    saved = opt.state_dict(0, 3)
    opt.step(grad, torch.tensor(4))
    for (n, p), (_, q) in zip(models[0].named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=n)
    # torch's state -> replica 1: its moments become replica 0's as saved after step 3
    opt.load_state_dict(1, saved)
    for key, t in (("exp_avg", opt.exp_avg), ("exp_avg_sq", opt.exp_avg_sq)):
        want = torch.cat([saved["state"][i][key].reshape(-1) for i in range(len(opt.names))])
        assert torch.equal(t[1], want)


def test_the_models_read_the_weights_the_stack_trains():
    """The models' parameters are views of the flat rows: a step moves them, and a load_state_dict into a model
    writes the row (what evaluation and checkpoints rely on)."""
    models = [Tiny(s) for s in range(2)]
    before = [p.detach().clone() for p in models[1].parameters()]
    opt = StackedAdamW(models, [Cfg(1.0), Cfg(1.0)], torch.tensor([1e-2, 1e-2]))
    assert all(torch.equal(p, b) for p, b in zip(models[1].parameters(), before))   # the weights kept
    opt.step(torch.ones(opt.flat.shape), torch.tensor(1))
    assert all(not torch.equal(p, b) for p, b in zip(models[1].parameters(), before))
    models[0].load_state_dict(Tiny(7).state_dict())
    w = opt.weights()
    assert torch.equal(w["a.weight"][0], Tiny(7).a.weight) and torch.equal(w["conv"][0], Tiny(7).conv)
