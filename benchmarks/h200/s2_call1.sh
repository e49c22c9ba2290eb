# Session 2, first call: start the detached jobs on GPUs 1-7, then GPU 0 measures alone:
# task bits CPU == CUDA, the end-to-end step triton vs torch (issue 5), SSE masking vs varlen
# and varlen N=16 vs N=1 (issues 4 and 5), the kernel check and table.
source benchmarks/h200/setup.sh
rm -rf /tmp/repo && cp -a . /tmp/repo && mkdir -p /tmp/work/logs
setsid nohup bash /tmp/repo/benchmarks/h200/s2_jobs.sh > /tmp/work/logs/jobs.log 2>&1 < /dev/null &
export CUDA_VISIBLE_DEVICES=0
G=/tmp/work/gpu0; mkdir -p $G
python3 - <<'PY' 2>&1 | tee $G/determinism.txt
import torch
from sandbox.tasks import make_task
for kw in [dict(seq_len=256, num_kv_pairs=16), dict(seq_len=512, num_kv_pairs=64, noise=64), dict(seq_len=512, num_kv_pairs=32, gap=128)]:
    a = make_task("mqar", vocab_size=8192, seed=3, device="cpu", **kw)
    b = make_task("mqar", vocab_size=8192, seed=3, device="cuda", **kw)
    for split, idx in (("train", 0), ("train", 12345), ("test", 1)):
        xa, ya = a.sample(128, split, idx); xb, yb = b.sample(128, split, idx)
        print(kw, split, idx, "identical:", torch.equal(xa, xb.cpu()) and torch.equal(ya, yb.cpu()))
PY
timeout 120 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 --impls triton,torch --profile > $G/profile_gla.txt 2>&1; grep -E "ms/step|sampling|ratio|Self CUDA time" $G/profile_gla.txt
timeout 45 python3 benchmarks/profile_step.py --mixer gla --d-model 128 --seq-len 256 --kv 16 --batch 256 --impls triton --profile > $G/profile_gla_small.txt 2>&1; grep -E "ms/step|sampling|Self CUDA time" $G/profile_gla_small.txt
timeout 60 python3 benchmarks/sse_impl_speed.py --n 4 --k 1 --seq-lens 512,4096 2>&1 | tee $G/sse_speed_n4.txt | tail -4
for n in 1 16; do timeout 50 python3 benchmarks/sse_impl_speed.py --n $n --k 1 --seq-lens 4096 2>&1 | tee $G/sse_speed_n$n.txt | tail -3; done
timeout 150 python3 -m sandbox.cli bench kernels --check --no-fla --deadline 120 --out $G/bench.json > $G/bench.txt 2>&1; tail -30 $G/bench.txt
bash benchmarks/h200/s2_collect.sh 0
