# Session 6, call 4 (one H200): v8 with every column of the kernel table in one process: ours, fla
# chunk_gla, SDPA flash and the torch chunked reference (checks ran in call 3 on the same code).
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 420 python3 -m sandbox.cli bench kernels --gates diag --shapes "$S" --no-sse --no-profile \
  --deadline 400 --out $OUT/v8_torch.json > $OUT/v8_torch.txt 2>&1; tail -10 $OUT/v8_torch.txt
