#!/bin/bash
# Session 3, detached (started by s4_call4.sh): the rest of issue 3 on one H200 - the GSA rows and
# Gated DeltaNet top-k - resumed from the committed journals with --retry-failed. Collect with
# s2_collect.sh.
cd /tmp/repo && source benchmarks/h200/setup.sh > /dev/null
W=/tmp/work; mkdir -p $W/sweeps $W/logs
R=results/h200-2026-11-21
sweep() {   # name workers-flags
  python3 -m sandbox.cli sweep sweeps/$1.yaml --out $W/sweeps/$1 $2 --no-live > $W/logs/$1.log 2>&1
  echo "$(date +%T) $1 exit $?" >> $W/logs/done.txt
}
for s in linear_family linear_family_topk; do mkdir -p $W/sweeps/$s; cp $R/$s/study.journal $W/sweeps/$s/; done
nvidia-smi dmon -s u -d 10 > $W/logs/dmon.log 2>&1 &
sweep linear_family "--workers-per-gpu 3 --retry-failed" &
sweep linear_family_topk "--workers-per-gpu 6 --retry-failed" &
wait
echo "$(date +%T) all done" >> $W/logs/done.txt
touch $W/jobs.done
