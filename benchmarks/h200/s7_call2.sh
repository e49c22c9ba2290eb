# Session 6, call 2 (one H200): A/B of the backward gradient kernel with the intra products done before the
# state loop and sharing its accumulators (new, repo root) against call 1's order (_ab/, commit 7af7da0);
# family checks of the new one; the whole GLA training step.
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
for i in 1 2; do
  timeout 100 python3 benchmarks/gla_profile.py --shapes "64,512,2,256" --warps "bwd_chunk=4,8" > $OUT/prof_new$i.txt 2>&1
  (cd _ab && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 benchmarks/gla_profile.py --shapes "64,512,2,256" \
     --warps "bwd_chunk=4" > $OUT/prof_old$i.txt 2>&1)
  grep -E "fwd\+bwd|_bwd_chunk|compiled bwd" $OUT/prof_new$i.txt; echo "-- old"; grep -E "fwd\+bwd|_bwd_chunk|compiled bwd" $OUT/prof_old$i.txt
done
timeout 150 python3 benchmarks/bwd_tiles_check.py --tiles 64x64 --warps 4 > $OUT/chk.txt 2>&1
grep -E "FAIL|checks passed" $OUT/chk.txt || tail -3 $OUT/chk.txt
timeout 150 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off > $OUT/step_gla.txt 2>&1; grep -E "ms/step|ratio" $OUT/step_gla.txt
