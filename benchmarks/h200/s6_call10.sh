# Session 5, call 10 (one H200): tiles (K x V) and warps of the backward gradient kernel.
source benchmarks/h200/setup.sh
timeout 300 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512" --tiles "64x64,64x32,32x64,32x32" \
  --warps "bwd_chunk=8,4" > $OUT/p_tiles.txt 2>&1; grep -v Warn $OUT/p_tiles.txt | grep -E "warps|_bwd_chunk|compiled bwd"
