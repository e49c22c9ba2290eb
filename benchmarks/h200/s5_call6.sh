# Session 4, call 6 (one H200): the SSE varlen case after the backward reuses the forward's chunk table
# (one host sync fewer per step); run twice to see the spread between runs.
source benchmarks/h200/setup.sh
for i in 1 2; do
timeout 120 python3 -m sandbox.cli bench kernels --check --no-family --no-torch --no-fla --no-profile --gates diag \
  --shapes "64,512,2,64" --deadline 110 --out $OUT/bench_sse_$i.json > $OUT/bench_sse_$i.txt 2>&1; grep -E "FAIL|SSE|^shape" $OUT/bench_sse_$i.txt
done
