"""SSE masking vs varlen: ms per training step of a 2-layer SSE language model.

    python benchmarks/sse_impl_speed.py [--n 4 --k 1 --d-model 128 --heads 2 --batch 8
                                         --seq-lens 512,4096 --steps 20 --warmup 5 --kernel auto]

A step is forward + backward + AdamW update on random tokens (bf16 autocast on CUDA, as in
training). Both implementations run in the same process on the same inputs and weights; the
script prints ms per step and the ratio varlen / masking (< 1: varlen faster) per sequence
length, and checks that the two losses agree. Without a GPU it falls back to tiny CPU shapes
(d_model 32, seq_len 64 and 256, batch 2) so that it still runs as a smoke test.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F

from sandbox.config import ModelConfig
from sandbox.mixers.sse import SSEConfig
from sandbox.model import LanguageModel

VOCAB = 8192


def make_model(args, impl: str, seq_len: int, device) -> LanguageModel:
    sse = SSEConfig(n=args.n, k=args.k, impl=impl, kernel=args.kernel)
    cfg = ModelConfig(mixer="sse", d_model=args.d_model, n_layers=2, n_heads=args.heads,
                      mixer_options={"sse": sse})
    torch.manual_seed(0)
    return LanguageModel(cfg, VOCAB, seq_len).to(device)


def time_steps(model, tokens, steps: int, warmup: int, autocast) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cuda = tokens.is_cuda
    loss = None
    for i in range(warmup + steps):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        with autocast():
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            aux = model.aux_loss()
            total = loss if aux is None else loss + aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / steps, float(loss.detach())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-lens", default="512,4096")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--kernel", default="auto", choices=["auto", "torch", "naive", "triton"])
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    if not cuda:
        print("no GPU: tiny CPU shapes (smoke test only; the numbers say nothing about the GPU)")
        args.d_model, args.batch, args.steps, args.warmup = 32, 2, 2, 1
        seq_lens = [64, 256]
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device {name}; SSE n{args.n}k{args.k}, d_model {args.d_model}, {args.heads} heads, 2 layers, "
          f"batch {args.batch}, kernel {args.kernel}, {args.steps} timed steps")
    print(f"{'seq_len':>8} {'masking ms':>11} {'varlen ms':>10} {'varlen/masking':>15} {'loss diff':>10}")
    for T in seq_lens:
        gen = torch.Generator().manual_seed(T)
        tokens = torch.randint(0, VOCAB, (args.batch, T + 1), generator=gen).to(device)
        ms, losses = {}, {}
        for impl in ("masking", "varlen"):
            model = make_model(args, impl, T, device)
            ms[impl], losses[impl] = time_steps(model, tokens, args.steps, args.warmup, autocast)
            del model
            if cuda:
                torch.cuda.empty_cache()
        print(f"{T:>8} {ms['masking']:>11.2f} {ms['varlen']:>10.2f} {ms['varlen'] / ms['masking']:>15.3f} "
              f"{abs(losses['masking'] - losses['varlen']):>10.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
