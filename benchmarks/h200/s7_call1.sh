# Session 6, call 1 (one H200): v8 = whole-chunk intra product (one dot per K tile when the chunk decays by
# less than exp(40) in it) in _fwd_intra and the backward's K-tile programs.  Per-kernel profile first,
# then the checks (every family and gate) and the five shapes with fla in one process.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
timeout 150 python3 benchmarks/gla_profile.py --shapes "64,512,2,256" --tiles "64x64,32x64" \
  --warps "bwd_chunk=4,8" > $OUT/profile.txt 2>&1; tail -40 $OUT/profile.txt
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 330 python3 -m sandbox.cli bench kernels --check --no-torch --gates diag,scalar,none --shapes "$S" \
  --deadline 320 --out $OUT/v8.json > $OUT/v8.txt 2>&1; grep -E "passed|FAIL|fail|rror" $OUT/v8.txt | head; tail -12 $OUT/v8.txt
