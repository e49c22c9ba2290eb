# Session 2: wait until the detached jobs are done or $1 seconds have passed, then report
# progress and pack /tmp/work (no checkpoints or event files) into $OUT/work.tgz.
W=/tmp/work; T=$(( $(date +%s) + ${1:-0} ))
while [ ! -e $W/jobs.done ] && [ $(date +%s) -lt $T ]; do sleep 10; done
cd /tmp/repo 2>/dev/null || true
cat $W/logs/done.txt 2>/dev/null
for d in $W/sweeps/*/; do echo "== $d"; python3 -m sandbox.cli sweep status $d 2>&1 | tail -4; done
for f in $W/logs/hyb*.log; do echo "== $f"; tail -14 $f; done
awk 'NR>2 && $1 ~ /^[0-9]+$/ {s[$1]+=$2; n[$1]++} END {for (g in s) printf "gpu%s mean sm%% %.1f (%d samples)\n", g, s[g]/n[g], n[g]}' $W/logs/dmon.log 2>/dev/null | sort
tar czf $OUT/work.tgz -C $W --exclude='*.pt' --exclude='events.out.tfevents*' . ; ls -la $OUT
