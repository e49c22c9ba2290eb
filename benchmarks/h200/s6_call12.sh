# Session 5, call 12 (one H200): which tiles / warps of the backward gradient kernel pass every family check
# (32-wide K tiles with 4 warps failed the strong-decay check and faulted in call 11).
source benchmarks/h200/setup.sh
for cfg in "32x64 4" "32x64 8" "64x64 4" "64x64 8"; do
  set -- $cfg
  CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 benchmarks/bwd_tiles_check.py --tiles $1 --warps $2 > $OUT/chk_$1_$2.txt 2>&1
  grep -E "checks passed|^   " $OUT/chk_$1_$2.txt || tail -3 $OUT/chk_$1_$2.txt
done
