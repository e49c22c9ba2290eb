# Session 3, fourth call: start the issue 3 sweeps detached, wait, report and pack what is done.
source benchmarks/h200/setup.sh > /dev/null
rm -rf /tmp/repo && cp -a . /tmp/repo && mkdir -p /tmp/work/logs
setsid nohup bash /tmp/repo/benchmarks/h200/s4_jobs.sh > /tmp/work/logs/jobs.log 2>&1 < /dev/null &
bash /tmp/repo/benchmarks/h200/s2_collect.sh ${1:-560}
