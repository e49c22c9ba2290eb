#!/usr/bin/env bash
# The one entry point for GPU work: every device call runs `bash benchmarks/device.sh RECIPE [ARGS...]`
# (chain several with `;`). Outputs go to $OUT (default ./device_out), a few files per recipe, so that
# they come back from the device machine (at most 8 files per call: bulky outputs are tarred).
#
# Recipes:
#   env                      the GPU, driver, and package versions
#   checks [families | tests | PYTEST_ARGS]  every Triton kernel family against its float64 reference on this GPU, plus the
#                            GPU-only tests (CUDA graph = eager, stacked replicas = solo runs in bf16, kernel
#                            tiles that Triton 3.6 miscompiles on Hopper); with PYTEST_ARGS only those tests.
#                            On a cold machine the whole recipe takes about 10.5 minutes, past one call: run
#                            `checks families` (the families alone, 3 minutes), then `checks tests` (the tests alone)
#   bench-kernels [ARGS]     `sandbox bench kernels --check ARGS` (fla beside ours when its wheel is in .whl)
#   bench-train [ARGS]       `sandbox bench train --ref .ref/REF ARGS` (REF: $REF, else the newest directory in .ref;
#                            REF=none or none carried: no ref. With --sweep too: each kind's stack is also timed by that code)
#   bench-sweep FILE [ARGS]  `sandbox bench sweep FILE --ref .ref/REF ARGS` (trial-steps per GPU-second)
#   sweep FILE [ARGS]        `sandbox sweep FILE --out sweeps_out/NAME --time-limit SWEEP_SECONDS ARGS` (resumes;
#                            default 500 s, inside a call's 10 minutes: only trials that finish in time start);
#                            tars the directory as results/NAME without checkpoints. Chain calls while the
#                            machine is warm: it keeps the checkpoints of any trial the limit stopped. Untar
#                            each call's results/NAME into the checkout before the next call: a machine taken
#                            back in between is replaced by a fresh one that starts from the checkout's copy,
#                            and two journals that went apart cannot be merged.
#   sweep-detached FILE [ARGS]  `sandbox sweep FILE --out DIR ARGS` with no time limit (the runner's own packing:
#                            workers under MPS, as a user runs it) in a process session of its own, which outlives
#                            the call while the machine stays warm; then as sweep-wait. DIR: $SWEEP_DIR, else
#                            sweeps_out/NAME (resumed from results/NAME). For a sweep longer than one call
#   sweep-wait DIR [SECONDS] wait up to SECONDS (default 540) for DIR's detached sweep; say how long it has run, its
#                            trials' states and its wall time once done, and tar DIR as the sweep recipe does
#                            (each call brings back what is there: a machine taken back loses the rest)
#   inspect DIR...           `sandbox inspect DIR --device cuda` of each run directory (one with checkpoint.pt,
#                            e.g. sweeps_out/NAME/trials/N-xxxx on a warm machine after a sweep call); tars the
#                            pictures, inspect.md and summary.json of each as inspect/<N-xxxx>/. A figure's sweep
#                            directory (sweeps_out/NAME) gets its state pictures, tarred as
#                            results/NAME/state_pictures/; picture runs whose checkpoints this machine lacks
#                            (the checkpoints do not come back) are trained again from their recorded configs
#   repeat RESULT [N] [ARGS] train the configuration that RESULT (a trial's result.json) recorded N times
#                            (default 3), each alone (ARGS: `sandbox train` options, e.g. --set
#                            train.compile=false), and list each repeat's accuracy beside the recorded one:
#                            does the same configuration give the same result on this GPU? COLD=1: each repeat
#                            compiles into empty Inductor and Triton caches of its own (as on a fresh machine)
#   script NAME [ARGS]       `python benchmarks/NAME.py ARGS` into $OUT/NAME.txt (a kernel's own speed or tile script);
#                            with REF=<commit> (carried in .ref/) the same script then imports that commit's sandbox
#   collect DIR...           tar the named directories into $OUT/collect.tar.gz
#
# What the GPU image lacks travels with the call: Python wheels in .whl/ (optuna and its needs, fla:
# `bash ../shared/tools/gpu-wheels.sh .whl`), another commit's code in .ref/<commit>/ (`git worktree add
# --detach .ref/<commit> <commit>`); name both in the call's `carry`. Both paths are git-ignored.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/sandbox-inductor}"
if [ -d .whl ] && ! python3 -c "import optuna" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site" || { echo "device.sh: wheel install failed"; exit 1; }
elif [ -d /tmp/site ]; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# The image sets PYTHONDONTWRITEBYTECODE and ships no bytecode, so every process compiled the source of each module it
# imported: 3 s for `import torch`, about 10 s more for Dynamo, Inductor and sympy at a step's first compilation, in each
# sweep worker and helper (a pip install writes the bytecode once). Bytecode goes to a cache of its own instead, written
# once per machine for site-packages before the recipe runs (not in any timed window); BYTECODE=0: as the image has it.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ "${BYTECODE:-1}" != 0 ]; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/sandbox-pycache
    if [ ! -e "$PYTHONPYCACHEPREFIX/.done" ]; then
        t0=$(date +%s.%N)
        python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
            ${PYTHONPATH//:/ } >/dev/null 2>&1
        mkdir -p "$PYTHONPYCACHEPREFIX" && touch "$PYTHONPYCACHEPREFIX/.done"
        echo "device.sh: site-packages compiled to bytecode in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
    fi
fi
sandbox() { python3 -m sandbox.cli "$@"; }
# a sweep directory as it comes back: results and logs without checkpoints, TensorBoard events or the run's own files
tar_sweep() {
    tar -czf "$OUT/sweep_$(basename "$1").tar.gz" --exclude='*.pt' --exclude='events.*' --exclude=mps --exclude=.lock \
        --exclude='pace-*' --transform "s|^sweeps_out/|results/|" "$1"
}

recipe="${1:-}"
shift || true
case "$recipe" in
env)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
        | tee -a "$OUT/env.txt"
    python3 -c "import optuna; print('optuna', optuna.__version__)" 2>/dev/null | tee -a "$OUT/env.txt"
    ;;
checks)
    tests=(tests/test_mqar.py tests/test_graph_step.py tests/test_replicas.py tests/test_recurrence.py tests/test_kernel_grids.py
           tests/test_gla_small_heads.py)
    only=
    case "${1:-}" in
        families) only=families ;;
        tests) only=tests ;;
        ?*) only=tests; tests=("$@") ;;
    esac
    if [ "$only" = tests ]; then : > "$OUT/checks.txt"; else
        sandbox bench kernels --check --shapes none --no-fla --no-torch --no-sse --no-profile \
            --out "$OUT/checks.json" 2>&1 | tee "$OUT/checks.txt"
        status=${PIPESTATUS[0]}
        [ "$only" = families ] && exit "$status"
    fi
    python3 -m pytest -q -rP --durations=15 -p no:cacheprovider -p no:logging "${tests[@]}" 2>&1 | tee -a "$OUT/checks.txt"
    echo "pytest exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/checks.txt"   # its summary line went missing twice
    ;;
bench-kernels)
    sandbox bench kernels --check --out "$OUT/bench_kernels.json" "$@" 2>&1 | tee "$OUT/bench_kernels.txt"
    ;;
bench-train)
    ref=${REF:+.ref/$REF/}; ref=${ref:-$(ls -td .ref/*/ 2>/dev/null | head -n 1)}; [ "${REF:-}" = none ] && ref=
    rm -rf /tmp/bench_train    # an earlier call's bench.json would come back as this one's
    sandbox bench train ${ref:+--ref "$ref"} --out /tmp/bench_train "$@" 2>&1 | tee "$OUT/bench_train.txt"
    cp /tmp/bench_train/bench.json "$OUT/bench_train.json" 2>/dev/null
    cp /tmp/bench_train/estimate.json "$OUT/estimate.json" 2>/dev/null          # with --sweep
    tar -czf "$OUT/bench_train_logs.tar.gz" --exclude='*.pt' --exclude='events.*' -C /tmp bench_train
    ;;
bench-sweep)
    file="$1"; shift
    ref=${REF:+.ref/$REF/}; ref=${ref:-$(ls -td .ref/*/ 2>/dev/null | head -n 1)}; [ "${REF:-}" = none ] && ref=
    sandbox bench sweep "$file" ${ref:+--ref "$ref"} --out /tmp/bench_sweep "$@" 2>&1 | tee "$OUT/bench_sweep.txt"
    cp /tmp/bench_sweep/bench.json "$OUT/bench_sweep.json" 2>/dev/null
    tar -czf "$OUT/bench_sweep_logs.tar.gz" --exclude='*.pt' --exclude='events.*' --exclude=cache -C /tmp bench_sweep
    ;;
sweep)
    file="$1"; shift
    name=$(python3 -c "import yaml, sys; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$file")
    # the sweep runs in the git-ignored sweeps_out/NAME, which a warm device machine keeps between calls
    # (checkpoints included: a call made within its idle time resumes interrupted trials where they
    # stopped); a cold one starts from the copy in results/NAME (journal and results, no checkpoints)
    dir="sweeps_out/$name"
    if [ ! -f "$dir/study.journal" ] && [ -f "results/$name/study.journal" ]; then
        mkdir -p sweeps_out && cp -r "results/$name" "$dir"
    fi
    # --time-limit: near the end workers start only what finishes in time (a cold machine's checkpoints
    # are lost with it); the timeout is a guard behind it
    secs="${SWEEP_SECONDS:-500}"
    timeout -s INT "$((secs + 80))" python3 -m sandbox.cli sweep "$file" --out "$dir" --no-live \
        --time-limit "$secs" "$@" 2>&1 | tee "$OUT/sweep_$name.txt"
    tar_sweep "$dir"
    ;;
sweep-detached)
    file="$1"; shift
    name=$(python3 -c "import yaml, sys; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$file")
    dir="${SWEEP_DIR:-sweeps_out/$name}"
    if [ -z "${SWEEP_DIR:-}" ] && [ ! -f "$dir/study.journal" ] && [ -f "results/$name/study.journal" ]; then
        mkdir -p sweeps_out && cp -r "results/$name" "$dir"
    fi
    mkdir -p "$dir"
    date +%s > "$dir.started"
    # the sweep imports a copy of the code: a later call replaces the working tree, which may have changed since
    code="/tmp/sweep-code/$(basename "$dir")"; rm -rf "$code"; mkdir -p "$code"; cp -r sandbox "$code/"
    # bash -c writes its own pid, then becomes the launcher (exec): sweep-wait waits on that pid
    PYTHONPATH="$code:$PYTHONPATH" setsid bash -c 'echo $$ > "$1.pid"; shift; exec "$@"' _ "$dir" python3 -m sandbox.cli sweep "$file" --out "$dir" \
        --no-live "$@" > "$dir.log" 2>&1 < /dev/null &
    sleep 2
    exec bash "$0" sweep-wait "$dir" "${WAIT_SECONDS:-540}"
    ;;
sweep-wait)
    dir="$1"; secs="${2:-540}"
    [ -f "$dir.pid" ] || { echo "device.sh: sweep-wait: no detached sweep in $dir on this machine (a fresh one?)"; exit 1; }
    pid=$(cat "$dir.pid"); end=$((SECONDS + secs))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 5; done
    state=finished; kill -0 "$pid" 2>/dev/null && state=running
    echo "detached sweep in $dir: $state, $(( $(date +%s) - $(cat "$dir.started") )) s since it started" \
        | tee "$OUT/sweep_wait.txt"
    python3 -m sandbox.cli sweep status "$dir" 2>&1 | tee -a "$OUT/sweep_wait.txt"
    cp "$dir.log" "$OUT/sweep_detached.log"
    tar_sweep "$dir"
    ;;
inspect)
    rm -rf /tmp/inspect && mkdir -p /tmp/inspect
    for run in "$@"; do
        if [ -f "$run/sweep.yaml" ]; then
            sandbox inspect "$run" --device cuda 2>&1 | tee -a "$OUT/inspect.txt"
            tar -czf "$OUT/state_pictures_$(basename "$run").tar.gz" --exclude='*.pt' --exclude='events.*' \
                --transform "s|^sweeps_out/|results/|" "$run/state_pictures"
            continue
        fi
        sandbox inspect "$run" --device cuda --no-tensorboard --out "/tmp/inspect/$(basename "$run")" 2>&1 \
            | tail -n 3 | tee -a "$OUT/inspect.txt"
    done
    if [ -n "$(ls /tmp/inspect)" ]; then tar -czf "$OUT/inspect.tar.gz" -C /tmp inspect; fi
    ;;
repeat)
    src="$1"; n="${2:-3}"; shift; shift || true
    rm -rf /tmp/repeat /tmp/repeat-cache && mkdir -p /tmp/repeat
    python3 -c "import json, sys, yaml; c = json.load(open(sys.argv[1]))['config']; c['name'] = 'repeat'
yaml.safe_dump(c, open('/tmp/repeat/config.yaml', 'w'))" "$src" || exit 1
    for i in $(seq 1 "$n"); do
        caches=(); [ "${COLD:-}" = 1 ] && caches=(TORCHINDUCTOR_CACHE_DIR="/tmp/repeat-cache/$i/inductor" \
                                                   TRITON_CACHE_DIR="/tmp/repeat-cache/$i/triton")
        env "${caches[@]}" python3 -m sandbox.cli train /tmp/repeat/config.yaml --out "/tmp/repeat/$i" --no-progress \
            "$@" 2>&1 | tail -n 2
    done
    python3 - "$src" /tmp/repeat > "$OUT/repeat.txt" <<'EOF'
import json, sys
from pathlib import Path
rows = [("recorded", json.load(open(sys.argv[1])))]
rows += [(p.name, json.load(open(p / "result.json"))) for p in sorted(Path(sys.argv[2]).glob("*/"), key=lambda p: p.name)
         if (p / "result.json").exists()]
print(sys.argv[1])
print("run       best acc  best step  steps/s  compiled at  last test loss    test accuracy at each eval")
for name, r in rows:
    accs = " ".join(f"{h['test/accuracy']:.3f}" for h in r["history"])
    print(f"{name:9} {r['best_accuracy']:8.4f}  {r['best_step']:9}  {r['steps_per_sec']:7.1f}  "
          f"{str(r.get('compiled_at') or '-'):>11}  {r['history'][-1]['test/loss']:.12f}  {accs}")
EOF
    cat "$OUT/repeat.txt"
    ;;
script)
    name="$1"; shift
    python3 "benchmarks/$name.py" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    if [ -n "${REF:-}" ] && [ "$REF" != none ]; then
        echo "--- the same with .ref/$REF's sandbox" | tee -a "$OUT/$name.txt"
        PYTHONPATH="$PWD/.ref/$REF${PYTHONPATH#"$PWD"}" python3 "benchmarks/$name.py" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    fi
    ;;
collect)
    tar -czf "$OUT/collect.tar.gz" "$@"
    ;;
*)
    sed -n "2,30p" "$0"
    exit 2
    ;;
esac
