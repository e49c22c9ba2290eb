# H200 run C (last of the session): where a training step's GPU time goes, the end-to-end
# Triton vs torch step ratio, the kernel check + bench at the shapes (without fla,
# whose autotuning takes minutes per head dim), and SSE masking vs varlen ms per step.
source benchmarks/h200/setup.sh
timeout 120 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 --impls triton,torch --profile 2>&1 | tee $OUT/profile_gla.txt | grep -v "^-\|^ *$" | head -40
timeout 45 python3 benchmarks/profile_step.py --mixer gla --d-model 128 --seq-len 256 --kv 16 --batch 256 --impls triton --profile 2>&1 | tee $OUT/profile_gla_small.txt | head -30
timeout 150 python3 -m sandbox.cli bench kernels --check --no-fla --deadline 120 --out $OUT/bench.json 2>&1 | tee $OUT/bench.txt | tail -45
timeout 60 python3 benchmarks/sse_impl_speed.py --seq-lens 512,4096 2>&1 | tee $OUT/sse_speed.txt | tail -12
