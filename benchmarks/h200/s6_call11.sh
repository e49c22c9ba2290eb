# Session 5, calls 11 and 13 (one H200): v7 final (whole-chunk intra kernels, backward intra fused into the
# per-chunk gradient kernel (4 warps; call 11 had 32-wide K tiles, which failed), dA from its own kernel,
# _fwd_intra one stage).
# The whole GLA step, then checks (every family and gate) and the five shapes with fla in one process,
# the SSE varlen case and the per-kernel profile.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
timeout 150 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off > $OUT/step_gla.txt 2>&1; grep -E "ms/step|ratio" $OUT/step_gla.txt
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 330 python3 -m sandbox.cli bench kernels --check --no-torch --gates diag,scalar,none --shapes "$S" \
  --deadline 320 --out $OUT/v7.json > $OUT/v7.txt 2>&1; grep -E "passed|FAIL|fail|rror" $OUT/v7.txt | head; tail -12 $OUT/v7.txt
grep -A9 "^profile triton_diag" $OUT/v7.txt | head -24
