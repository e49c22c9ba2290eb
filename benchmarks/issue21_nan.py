"""Issue 21: GLA d_model 64, 2 heads, top-k 4, conv 4 on MQAR (16 pairs, gap 192, T 320), batch 256 gives a
NaN loss by step 25.  Trains that config step by step (the training loop's optimizer, schedule, clipping and
autocast; eager, a sync per step) and stops at the first non-finite loss or gradient; then says which tensor
went bad first (the recurrence's inputs, its output, or the gradients it returns) and reruns the recurrence on
the captured inputs with every implementation against the float64 per-step loop.

    python benchmarks/issue21_nan.py --impl triton --precision bf16 --steps 40 --out runs/issue21
"""
from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

CONFIG = {
    "task": {"name": "mqar", "seq_len": 320, "num_kv_pairs": 16, "vocab_size": 8192, "gap": 192},
    "model": {"mixer": "gla", "d_model": 64, "n_layers": 2, "n_heads": 2, "channel_mixer": "swiglu",
              "gla": {"topk": 4, "conv_size": 4}},
    "train": {"steps": 3000, "batch_size": 256, "lr": 1.0e-3},
}


def stats(x):
    if x is None:
        return None
    xf = x.detach().float()
    fin = torch.isfinite(xf)
    return {"dtype": str(x.dtype).replace("torch.", ""), "finite": bool(fin.all()),
            "n_bad": int((~fin).sum()), "absmax": float(xf[fin].abs().max()) if fin.any() else None}


def compare(cap, rows, impls):
    """The recurrence on the captured inputs (batch rows ``rows``) with each impl against float64 naive."""
    from sandbox.kernels import linear_recurrence
    q, k, v, g = (cap[n][rows].contiguous() for n in "qkvg")
    do = cap["do"][rows].contiguous().float()
    ref_in = [t.double().requires_grad_() for t in (q, k, v, g)]
    ro, _ = linear_recurrence(*ref_in, scale=cap["scale"], impl="naive")
    (ro * do.double()).sum().backward()
    out = {}
    for impl in impls:
        ins = [t.clone().requires_grad_() for t in (q, k, v, g)]
        o, _ = linear_recurrence(*ins, scale=cap["scale"], impl=impl)
        (o.float() * do).sum().backward()
        rel = lambda a, b: float((a.double() - b).norm() / b.norm().clamp_min(1e-300))  # noqa: E731
        out[impl] = {"o": rel(o, ro), "o_finite": bool(torch.isfinite(o).all()),
                     **{f"d{n}": rel(a.grad, b.grad) for n, a, b in zip("qkvg", ins, ref_in)},
                     **{f"d{n}_finite": bool(torch.isfinite(a.grad).all()) for n, a in zip("qkvg", ins)}}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="auto")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default="runs/issue21")
    ap.add_argument("--save", action="store_true", help="save the captured tensors of the bad layer (bad rows)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import sandbox.mixers.linear as L
    from sandbox.config import load_config
    from sandbox.tasks import TrainBatches
    from sandbox.train import build, lr_lambda, scored_positions

    cfg_path = out / "issue21.json"
    cfg_path.write_text(json.dumps(CONFIG))
    cfg = load_config(cfg_path, [f"model.gla.impl={a.impl}", f"train.batch_size={a.batch_size}",
                                 f"train.lr={a.lr}"])
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task, model = build(cfg, dev)
    tc = cfg.train
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr, betas=tuple(tc.betas))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc.steps, tc.warmup_frac))
    ac = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if a.precision == "bf16" else nullcontext

    caps = []
    orig = L.linear_recurrence

    def capture(q, k, v, g, beta, **kw):
        o, S = orig(q, k, v, g, beta, **kw)
        c = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "g": g.detach(), "o": o.detach(),
             "scale": kw["scale"], "leaves": {}}
        for n, t in (("q", q), ("k", k), ("v", v), ("g", g)):
            if t.requires_grad:
                t.register_hook(lambda gr, n=n, c=c: c["leaves"].__setitem__(n, gr.detach()))
        o.register_hook(lambda gr, c=c: c.__setitem__("do", gr.detach()))
        caps.append(c)
        return o, S

    L.linear_recurrence = capture
    batches = TrainBatches(task, tc.batch_size)
    per_row = getattr(task, "max_targets", None)
    report = {"args": vars(a), "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "steps": []}
    try:
        import triton
        report["triton"] = triton.__version__
    except ImportError:
        pass
    t0 = time.time()
    for step in range(a.steps):
        caps.clear()
        x, y = batches[step]
        for p in model.parameters():
            p.grad = None
        pos, yy = scored_positions(y, per_row)
        with ac():
            logits = model(x, pos)
            loss = F.cross_entropy(logits.float().flatten(0, 1), yy.flatten(), ignore_index=-100)
        loss.backward()
        bad_params = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        rec = {"step": step + 1, "loss": float(loss), "grad_norm": float(gn), "bad_params": bad_params[:8]}
        report["steps"].append(rec)
        print(json.dumps(rec), flush=True)
        if not math.isfinite(rec["loss"]) or bad_params:
            layers = []
            for i, c in enumerate(caps):
                lay = {n: stats(c.get(n)) for n in ("q", "k", "v", "g", "o", "do")}
                lay.update({f"d{n}": stats(t) for n, t in c["leaves"].items()})
                layers.append(lay)
            report["first_bad_step"] = step + 1
            report["layers"] = layers
            print(json.dumps(layers, indent=1), flush=True)
            # the first layer whose recurrence returned a bad output or bad gradient, with rows that show it
            for i, c in enumerate(caps):
                bad = ~torch.isfinite(c["o"].float()).flatten(1).all(1)
                for n, t in c["leaves"].items():
                    bad |= ~torch.isfinite(t.float()).flatten(1).all(1)
                if "do" in c and c["do"] is not None and torch.isfinite(c["do"]).all() and bad.any():
                    rows = bad.nonzero().flatten()[:2]
                    report["compare_layer"], report["compare_rows"] = i, rows.tolist()
                    impls = ["torch"] + (["triton"] if dev.type == "cuda" else [])
                    report["compare"] = compare(c, rows, impls)
                    print("compare", json.dumps(report["compare"], indent=1), flush=True)
                    if a.save:
                        torch.save({n: (c[n][rows].cpu() if torch.is_tensor(c[n]) else c[n])
                                    for n in ("q", "k", "v", "g", "do", "scale")}, out / "captured.pt")
                    break
            break
        opt.step()
        sched.step()
    report["wall_s"] = round(time.time() - t0, 1)
    (out / f"report_{a.impl}_{a.precision}.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
