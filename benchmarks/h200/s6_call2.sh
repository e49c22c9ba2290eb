# Session 5, call 2 (one H200): v7 (whole-chunk intra kernel in the forward; the backward's intra part
# fused into the per-chunk gradient kernel) checked on the H200 (all families, every gate), then timed
# beside fla and beside the session-4 code (copied into _ab/ by hand, run from there).
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 330 python3 -m sandbox.cli bench kernels --check --no-torch --gates diag,scalar,none \
  --shapes "$S" --deadline 320 --out $OUT/v7.json > $OUT/v7.txt 2>&1
grep -E "passed|FAIL|fail|rror" $OUT/v7.txt | head -20; grep -E "^shape|profile|^ +0|SSE|largest" $OUT/v7.txt | head -50; tail -9 $OUT/v7.txt
(cd _ab && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m sandbox.cli bench kernels --no-fla --no-torch --no-sse --no-profile \
  --gates diag --shapes "$S" --deadline 90 --out $OUT/v6.json > $OUT/v6.txt 2>&1; grep -E "^shape" $OUT/v6.txt)
