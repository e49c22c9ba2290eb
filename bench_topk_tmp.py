# throwaway (wip/topk-radix): run on the H200 with .ref/0d0f28e carried, OUT set; delete before merging
import importlib.util, json, os, sys
import torch, triton
sys.path.insert(0, os.getcwd())
from sandbox.kernels.triton_topk_mask import topk_mask_triton as new
spec = importlib.util.spec_from_file_location("old_topk", ".ref/0d0f28e/sandbox/kernels/triton_topk_mask.py")
old_mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(old_mod)
old = old_mod.topk_mask_triton
rows = 9 * 256 * 320 * 2
res = {}
for name, c, k, dt in (("gsa_slots64_top16_fp32", 64, 16, torch.float32), ("gla_rows32_top8_bf16", 32, 8, torch.bfloat16)):
    x = torch.randn(rows, c, device="cuda").to(dt)
    perm = torch.rand(rows, c, device="cuda").argsort(-1).to(dt)
    want = torch.zeros_like(perm, dtype=torch.bool).scatter_(-1, perm.float().topk(k, -1).indices, True)
    ties = torch.randint(-3, 4, (rows, c), device="cuda").to(dt)
    r = {"differ_from_topk": int((new(perm, k) != want).sum()), "differ_from_old_on_randn": int((new(x, k) != old(x, k)).sum()),
         "differ_from_old_on_ties": int((new(ties, k) != old(ties, k)).sum())}
    for label, f in (("new_ms", lambda: new(x, k)), ("old_ms", lambda: old(x, k)), ("torch_topk_ms", lambda: x.topk(k, -1))):
        r[label] = triton.testing.do_bench(f, warmup=50, rep=300)
    r["bytes_min_ms"] = (x.numel() * x.element_size() + x.numel()) / 4.8e12 * 1e3
    res[name] = r
    print(name, r, flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": rows, "results": res},
          open(os.environ["OUT"] + "/bench_topk_kernel.json", "w"), indent=1)
