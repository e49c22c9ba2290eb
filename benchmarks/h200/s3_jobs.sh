#!/bin/bash
# Next session, detached long jobs (started by s3_call1.sh under setsid; s2_collect.sh
# collects): finish issue 3 (the GSA rows after its memory fix, Gated DeltaNet top-k) by
# resuming the committed journals with --retry-failed, the conv_size 4 table, and the
# issue 8 sweeps on the remaining GPUs (journals resumable: copy them back next time).
cd /tmp/repo && source benchmarks/h200/setup.sh > /dev/null
W=/tmp/work; mkdir -p $W/sweeps $W/logs
R=results/h200-2026-11-21
sweep() {   # name gpus workers-flags
  CUDA_VISIBLE_DEVICES=$2 python3 -m sandbox.cli sweep sweeps/$1.yaml --out $W/sweeps/$1 $3 --no-live > $W/logs/$1.log 2>&1
  echo "$(date +%T) $1 exit $?" >> $W/logs/done.txt
}
for s in linear_family linear_family_topk; do mkdir -p $W/sweeps/$s; cp $R/$s/study.journal $W/sweeps/$s/; done
nvidia-smi dmon -s u -d 10 > $W/logs/dmon.log 2>&1 &
sweep linear_family 1 "--workers-per-gpu 3 --retry-failed" &
sweep linear_family_topk 2 "--workers-per-gpu 6 --retry-failed" &
sweep linear_family_conv4 3 "--workers-per-gpu 14" &
sweep sla_heads 4,5 "--workers-per-gpu 14" &
sweep sse_ablations 6,7 "--workers-per-gpu 14" &
wait
echo "$(date +%T) all done" >> $W/logs/done.txt
touch $W/jobs.done
