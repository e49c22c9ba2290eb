# Session 5, call 8 (one H200): v7 (= v7c) with other pipeline depths (num_stages) per kernel.
source benchmarks/h200/setup.sh
timeout 250 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512" \
  --warps "bwd_chunk=8,8/2,8/1,4/2" > $OUT/p_bwd.txt 2>&1; grep -v Warn $OUT/p_bwd.txt | grep -E "warps|_bwd_chunk|compiled bwd"
timeout 250 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512" \
  --warps "fwd_intra=4,4/2,4/1;fwd_o=4,4/2,8/3" > $OUT/p_fwd.txt 2>&1; grep -v Warn $OUT/p_fwd.txt | grep -E "warps|_fwd_intra|_fwd_o|compiled fwd"
