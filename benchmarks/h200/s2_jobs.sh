#!/bin/bash
# Session 2, detached long jobs (started by s2_call1.sh under setsid, so they outlive the call
# and later calls only collect): the issue 2/3/4 sweeps spread over GPUs $SWEEP_GPUS, the hybrid
# table (issue 9) alone on two GPUs, then the issue 6 timing pair (same 32 trials, 1 worker vs
# 8 workers on one GPU, then 8 per GPU on two GPUs).
cd /tmp/repo && source benchmarks/h200/setup.sh > /dev/null
W=/tmp/work; mkdir -p $W/sweeps $W/logs $W/hyb
SWEEP_GPUS=${SWEEP_GPUS:-1,2,3,4,5}; HA=${HA:-6}; HB=${HB:-7}
sweep() {   # name gpus workers-flag
  CUDA_VISIBLE_DEVICES=$2 python3 -m sandbox.cli sweep ${4:-sweeps/$1.yaml} --out $W/sweeps/$1 $3 --no-live > $W/logs/$1.log 2>&1
  echo "$(date +%T) $1 exit $?" >> $W/logs/done.txt
}
nvidia-smi dmon -s u -d 10 > $W/logs/dmon.log 2>&1 &
python3 - <<'PY'
import yaml
s = yaml.safe_load(open("sweeps/example.yaml"))
s["base"]["train"].update(steps=600, early_stop=None, eval_every=300)
s.pop("pruning", None)
for n in ("ex_seq", "ex_par1", "ex_par2"):
    s["name"] = n
    yaml.safe_dump(s, open(f"/tmp/work/{n}.yaml", "w"))
PY
sweep foundation_attention $SWEEP_GPUS "--workers-per-gpu 2" &
sweep linear_family $SWEEP_GPUS "--workers-per-gpu 3" & P1=$!
sweep linear_family_topk $SWEEP_GPUS "--workers-per-gpu 3" & P2=$!
sweep sse_mixers $SWEEP_GPUS "--workers-per-gpu 2" &
( CUDA_VISIBLE_DEVICES=$HA python3 benchmarks/hybrids_table.py configs/hybrids/{gdn,gdn_swa,lalte,lalte_dense}.yaml --out $W/hyb > $W/logs/hybA.log 2>&1
  echo "$(date +%T) hybA exit $?" >> $W/logs/done.txt
  sweep ex_par1 $HA "--workers-per-gpu 8" $W/ex_par1.yaml ) &
( CUDA_VISIBLE_DEVICES=$HB python3 benchmarks/hybrids_table.py configs/hybrids/{lansa,gdn_moba,gdn_attention,sse_h}.yaml --out $W/hyb > $W/logs/hybB.log 2>&1
  echo "$(date +%T) hybB exit $?" >> $W/logs/done.txt
  sweep ex_seq $HB "--workers 1" $W/ex_seq.yaml
  sweep ex_par2 $HA,$HB "--workers-per-gpu 8" $W/ex_par2.yaml ) &
wait $P1 $P2
sweep linear_family_conv4 $SWEEP_GPUS "--workers-per-gpu 3"
wait
python3 benchmarks/hybrids_table.py --out $W/hyb --no-train > $W/logs/hyb_table.log 2>&1
echo "$(date +%T) all done" >> $W/logs/done.txt
touch $W/jobs.done
