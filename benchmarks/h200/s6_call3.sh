# Session 5, call 3 (one H200): v7b (the backward's intra part split into dq and dk passes) per kernel,
# with registers / spills, and the warp counts of the two whole-chunk kernels.
source benchmarks/h200/setup.sh
timeout 400 python3 benchmarks/gla_profile.py --shapes "64,512,2,64;64,512,2,256;8,2048,2,512" \
  --warps "bwd_chunk=8,4;fwd_intra=4,8" > $OUT/profile.txt 2>&1; cat $OUT/profile.txt | grep -v Warn
