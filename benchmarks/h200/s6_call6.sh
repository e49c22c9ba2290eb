# Session 5, call 6 (one H200): v7d under register caps (maxnreg): more programs per SM against spills.
source benchmarks/h200/setup.sh
timeout 280 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512;64,512,2,64" \
  --warps "bwd_chunk=4,4:128,8:128,4:96" > $OUT/p_bwd.txt 2>&1; grep -v Warn $OUT/p_bwd.txt | grep -E "warps|_bwd_chunk|compiled bwd"
timeout 200 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512" \
  --warps "fwd_intra=4,4:128,8" > $OUT/p_fwd.txt 2>&1; grep -v Warn $OUT/p_fwd.txt | grep -E "warps|_fwd_intra|compiled fwd"
