# Session 3, last call (one H200, alone): the whole GLA step after casting each block input once,
# then fla's chunk_gla beside ours at the head dim 256 shapes (the 2x target at (64,512,2,256)).
source benchmarks/h200/setup.sh
timeout 100 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off > $OUT/profile_gla_cast.txt 2>&1; grep -E "ms/step|ratio" $OUT/profile_gla_cast.txt
timeout 420 python3 -m sandbox.cli bench kernels --gates diag --no-sse --no-torch --no-profile \
  --shapes "64,512,2,256;16,2048,2,256" --deadline 410 --out $OUT/bench_fla256.json > $OUT/bench_fla256.txt 2>&1; grep -E "shape|fla" $OUT/bench_fla256.txt | tail -6
