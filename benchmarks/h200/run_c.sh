# H200 run C: SSE / MoM / SLA table (issue 4), SSE masking vs varlen ms/step, the hybrids
# table at seq_len 2048 (issue 9), and single-trial baselines for the sweep speed-up (issue 6).
source benchmarks/h200/setup.sh
W=/tmp/work; mkdir -p $W/hybrids
T0=$(date +%s)
pids=()
timeout 480 python3 -m sandbox.cli sweep sweeps/sse_mixers.yaml --out $W/sse_mixers --workers-per-gpu 9 --no-live > $W/sse.log 2>&1 & pids+=($!)
for c in configs/hybrids/*.yaml; do
  n=$(basename $c .yaml)
  timeout 420 python3 -m sandbox.cli train $c --out $W/hybrids/$n --no-progress > $W/hybrids/$n.log 2>&1 & pids+=($!)
done
nvidia-smi dmon -s u -d 5 > $W/dmon.log 2>&1 & dmon=$!
wait "${pids[@]}"
kill $dmon 2>/dev/null
echo "training done after $(( $(date +%s) - T0 )) s"
timeout 60 python3 benchmarks/sse_impl_speed.py > $W/sse_speed.log 2>&1
timeout 60 python3 benchmarks/hybrids_table.py --out $W/hybrids --no-train > $W/hybrids_table.log 2>&1
for f in sse sse_speed hybrids_table; do echo "== $f"; tail -30 $W/$f.log; done
for n in $W/hybrids/*.log; do echo "== $n"; tail -2 $n; done
awk 'NR>2 && $2 ~ /^[0-9]+$/ {s+=$2; n++} END {if (n) print "mean GPU util (dmon sm%)", s/n, "over", n, "samples"}' $W/dmon.log
cd $W && tar czf $OUT/run_b.tgz --exclude='*.pt' --exclude='*.journal' . && ls -la $OUT
