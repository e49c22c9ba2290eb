# Session 4: fla's chunk_gla beside ours in one process at the shapes given ($1), autotune results kept
# (TRITON_CACHE_DIR, fla caches its autotuning there) and sent back for the next machine.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
timeout ${2:-560} python3 -m sandbox.cli bench kernels --gates diag --no-sse --no-torch --no-profile \
  --shapes "$1" --deadline $(( ${2:-560} - 15 )) --out $OUT/bench_fla.json > $OUT/bench_fla.txt 2>&1; grep -E "^shape|fla" $OUT/bench_fla.txt | tail -12
(cd .tcache && find . -name "*.autotune.json" | tar czf $OUT/autotune.tgz -T -); ls -la $OUT
