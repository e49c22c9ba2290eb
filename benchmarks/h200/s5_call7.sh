# Session 4, call 7 (one H200): checks after the shared helpers moved to triton_chunk_common.py (the
# intra kernels now take their sub-block through _sub_block), and the five shapes again.
source benchmarks/h200/setup.sh
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 240 python3 -m sandbox.cli bench kernels --check --no-fla --no-torch --no-sse --no-profile --gates diag,scalar,none \
  --shapes "$S" --deadline 230 --out $OUT/bench_v6b.json > $OUT/bench_v6b.txt 2>&1; grep -E "passed|FAIL|fail|rror" $OUT/bench_v6b.txt | head; tail -8 $OUT/bench_v6b.txt
