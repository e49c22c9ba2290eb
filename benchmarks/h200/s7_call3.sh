# Session 6, call 3 (one H200): v8 final (commit 7af7da0; call 2's reordered gradient kernel was slower and
# is not used).  Checks (every family and gate, now with the mixed-decay case) and the five shapes with fla
# in one process, the SSE varlen case, the per-kernel profile, then the whole GLA training step.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 360 python3 -m sandbox.cli bench kernels --check --no-torch --gates diag,scalar,none --shapes "$S" \
  --deadline 350 --out $OUT/v8_final.json > $OUT/v8_final.txt 2>&1
grep -E "passed|FAIL|fail|rror" $OUT/v8_final.txt | head; tail -12 $OUT/v8_final.txt
grep -A9 "^profile triton_diag" $OUT/v8_final.txt | head -24
timeout 150 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off > $OUT/step_gla.txt 2>&1; grep -E "ms/step|ratio" $OUT/step_gla.txt
