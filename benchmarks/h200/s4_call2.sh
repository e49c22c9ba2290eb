# Session 3, second call (one H200): fla's chunk_gla beside ours at the five issue shapes, alone
# on the GPU (fla autotunes for minutes per head dim), then the issue 3 sweeps start detached.
source benchmarks/h200/setup.sh
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 330 python3 -m sandbox.cli bench kernels --gates diag --no-sse --no-torch --no-profile --shapes "$S" \
  --deadline 320 --out $OUT/bench_fla.json > $OUT/bench_fla.txt 2>&1; tail -25 $OUT/bench_fla.txt
rm -rf /tmp/repo && cp -a . /tmp/repo && mkdir -p /tmp/work/logs
setsid nohup bash /tmp/repo/benchmarks/h200/s4_jobs.sh > /tmp/work/logs/jobs.log 2>&1 < /dev/null &
sleep 200; bash /tmp/repo/benchmarks/h200/s2_collect.sh 0 > /dev/null 2>&1; tail -5 /tmp/work/logs/*.log
