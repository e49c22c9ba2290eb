# Session 3, third call (one H200, alone): the intra-chunk kernels with the tiles chosen from
# intra_configs.txt - checked on the H200 and timed at the five shapes, the whole GLA step again
# (issue 5's 5x target), then fla's chunk_gla at the four shapes call 2 did not reach.
source benchmarks/h200/setup.sh
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 150 python3 -m sandbox.cli bench kernels --check --no-fla --gates diag --shapes "$S" \
  --deadline 140 --out $OUT/bench_new.json > $OUT/bench_new.txt 2>&1; grep -E "passed|FAIL|fail" $OUT/bench_new.txt; tail -9 $OUT/bench_new.txt
timeout 100 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off --profile > $OUT/profile_gla.txt 2>&1; grep -E "ms/step|sampling|ratio|Self CUDA" $OUT/profile_gla.txt
timeout 300 python3 -m sandbox.cli bench kernels --gates diag --no-sse --no-torch --no-profile \
  --shapes "8,4096,4,128;64,512,2,256;16,2048,2,256;8,2048,2,512" \
  --deadline 290 --out $OUT/bench_fla.json > $OUT/bench_fla.txt 2>&1; tail -9 $OUT/bench_fla.txt
