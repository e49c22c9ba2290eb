# Session 4, last call (one H200): v6 (the forward split into the state pass and a chunk-parallel output
# kernel; the backward keeps the forward's states). The whole GLA step first, then checks and the five
# shapes with fla in the same process (its autotuning cached from calls 3-4, carried in .tcache_carry).
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
timeout 150 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off --profile > $OUT/profile_gla.txt 2>&1; grep -E "ms/step|ratio" $OUT/profile_gla.txt
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 420 python3 -m sandbox.cli bench kernels --check --no-torch --gates diag --shapes "$S" \
  --deadline 410 --out $OUT/bench_v6.json > $OUT/bench_v6.txt 2>&1; grep -E "passed|FAIL|fail|rror|^shape" $OUT/bench_v6.txt | head -20; tail -10 $OUT/bench_v6.txt
grep -A12 "^profile triton_diag" $OUT/bench_v6.txt | head -30
