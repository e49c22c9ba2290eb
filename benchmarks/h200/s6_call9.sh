# Session 5, call 9 (one H200): v7e (_fwd_intra one stage, _fwd_o 8 warps); warps / stages of the state pass,
# the gate preparation and dA.
source benchmarks/h200/setup.sh
timeout 250 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;8,2048,2,512" \
  --warps "states=8,4,8/2;gate_prep=4,8/1" > $OUT/p_states.txt 2>&1; grep -v Warn $OUT/p_states.txt | grep -E "warps|_states|_gate_prep|compiled (states|gate)"
timeout 150 python3 benchmarks/gla_profile.py --shapes "64,512,2,256;64,512,2,64" \
  --warps "bwd_dA=4,4/1,8" > $OUT/p_da.txt 2>&1; grep -v Warn $OUT/p_da.txt | grep -E "warps|_bwd_dA|^ "
