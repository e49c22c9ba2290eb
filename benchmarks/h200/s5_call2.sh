# Session 4, second call (one H200): v5 with the block product - checks, the five shapes with a per-kernel
# profile and the SSE varlen case, then the whole GLA training step (the 5x target).
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 240 python3 -m sandbox.cli bench kernels --check --no-fla --no-torch --gates diag --shapes "$S" \
  --deadline 230 --out $OUT/bench_v5b.json > $OUT/bench_v5b.txt 2>&1; grep -E "passed|FAIL|fail|rror" $OUT/bench_v5b.txt | head; tail -10 $OUT/bench_v5b.txt
timeout 150 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off --profile > $OUT/profile_gla.txt 2>&1; grep -E "ms/step|ratio" $OUT/profile_gla.txt
grep -A12 "^profile triton_diag" $OUT/bench_v5b.txt | head -30
