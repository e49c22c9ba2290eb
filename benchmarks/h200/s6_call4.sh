# Session 5, call 4 (one H200): v7c (dA from its own kernel) per kernel with registers / spills, the
# host time of the small shape (cProfile), then the checks and the five shapes beside fla.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
timeout 200 python3 benchmarks/gla_profile.py --shapes "64,512,2,64;64,512,2,256;8,2048,2,512" --cprofile \
  --warps "bwd_chunk=8,4" > $OUT/profile.txt 2>&1; grep -v Warn $OUT/profile.txt | head -150
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 250 python3 -m sandbox.cli bench kernels --check --no-torch --no-profile --gates diag,scalar,none \
  --shapes "$S" --deadline 240 --out $OUT/v7c.json > $OUT/v7c.txt 2>&1
grep -E "passed|FAIL|fail|rror" $OUT/v7c.txt | head -20; tail -9 $OUT/v7c.txt
