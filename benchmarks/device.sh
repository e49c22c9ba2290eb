#!/usr/bin/env bash
# GPU runner: named recipes for the work that needs a GPU, run from a checkout on the GPU machine:
#
#   bash benchmarks/device.sh RECIPE [ARGS...]
#
# Every output goes into one folder, $OUT (default ./gpu_out): copy that folder back and the measurement
# files are there. Sweeps run into $OUT/sweeps/NAME.
#
# Recipes:
#   env                      the GPU, driver, and package versions
#   checks [families | tests | PYTEST_ARGS]
#                            every Triton kernel family against its float64 reference on this GPU, then the
#                            GPU-only tests (CUDA graph = eager, stacked replicas = solo runs in bf16, kernel
#                            tiles that Triton 3.6 miscompiles on Hopper, the fig8 compare preset's control
#                            learning, the uncompiled step's fused norms and activations); `families` or `tests`
#                            runs one half,
#                            PYTEST_ARGS only those tests
#   bench-kernels [ARGS]     `sandbox bench kernels --check ARGS` (fla beside ours where it is installed)
#   bench-train [ARGS]       `sandbox bench train ARGS`, against another commit's code when REF is set
#                            (with --sweep FILE: one stack of each kind of the sweep's trials)
#   bench-sweep FILE [ARGS]  `sandbox bench sweep FILE ARGS` (trial-steps per GPU-second), against REF if set
#   sweep FILE [ARGS]        `sandbox sweep FILE --out $OUT/sweeps/NAME ARGS`: the runner's own packing; rerun
#                            to resume. `sandbox verdict $OUT/sweeps/NAME` then judges a figure's claims
#   inspect DIR...           `sandbox inspect DIR --device cuda`: a run directory's pictures into
#                            $OUT/inspect/<run>/; a figure's sweep directory gets its state pictures in
#                            DIR/state_pictures/ (runs whose checkpoints are gone are trained again)
#   repeat RESULT [N] [ARGS] train the configuration a trial's result.json recorded N times (default 3), each
#                            alone (ARGS: `sandbox train` options, e.g. --set train.compile=false), and list
#                            each repeat's accuracy beside the recorded one. COLD=1: each repeat compiles into
#                            empty Inductor and Triton caches of its own, as on a fresh machine
#   script NAME [ARGS]       `python benchmarks/NAME.py ARGS` into $OUT/NAME.txt; with REF, again with that
#                            commit's sandbox
#
# REF=<commit> compares with another commit's code side by side, on the same GPU: check it out first with
# `git worktree add --detach .ref/<commit> <commit>` (REF=none: no comparison). A machine without internet
# installs the Python wheels it lacks from .whl/ (`pip download -d .whl optuna`, on a machine with it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/sandbox-inductor}"
if [ -d .whl ] && ! python3 -c "import optuna" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site" || { echo "device.sh: wheel install failed"; exit 1; }
elif [ -d /tmp/site ]; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# Container images often set PYTHONDONTWRITEBYTECODE and ship no bytecode: then every sweep worker and compile helper
# compiles the source of each module it imports (seconds for torch, more for Dynamo and Inductor). Bytecode goes to a
# cache of its own instead, written once per machine before the recipe runs; BYTECODE=0 leaves the setting alone.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ "${BYTECODE:-1}" != 0 ]; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/sandbox-pycache
    if [ ! -e "$PYTHONPYCACHEPREFIX/.done" ]; then
        python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
            ${PYTHONPATH//:/ } >/dev/null 2>&1
        mkdir -p "$PYTHONPYCACHEPREFIX" && touch "$PYTHONPYCACHEPREFIX/.done"
    fi
fi
sandbox() { python3 -m sandbox.cli "$@"; }
ref_dir() {     # the code REF names, checked out in .ref/REF/; nothing when REF is unset or none
    [ -z "${REF:-}" ] || [ "$REF" = none ] && return
    [ -d ".ref/$REF" ] || { echo "device.sh: REF=$REF: no .ref/$REF/ (git worktree add --detach .ref/$REF $REF)" >&2; exit 1; }
    echo ".ref/$REF/"
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
           tests/test_gla_small_heads.py tests/test_compare.py tests/test_fused_model.py)
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
    exit "${PIPESTATUS[0]}"
    ;;
bench-kernels)
    sandbox bench kernels --check --out "$OUT/bench_kernels.json" "$@" 2>&1 | tee "$OUT/bench_kernels.txt"
    ;;
bench-train)
    ref=$(ref_dir) || exit 1
    sandbox bench train ${ref:+--ref "$ref"} --out "$OUT/bench_train" "$@" 2>&1 | tee "$OUT/bench_train.txt"
    ;;
bench-sweep)
    file="$1"; shift
    ref=$(ref_dir) || exit 1
    sandbox bench sweep "$file" ${ref:+--ref "$ref"} --out "$OUT/bench_sweep" "$@" 2>&1 | tee "$OUT/bench_sweep.txt"
    ;;
sweep)
    file="$1"; shift
    name=$(python3 -c "import yaml, sys; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$file") || exit 1
    sandbox sweep "$file" --out "$OUT/sweeps/$name" --no-live "$@" 2>&1 | tee "$OUT/sweep_$name.txt"
    ;;
inspect)
    for run in "$@"; do
        if [ -f "$run/sweep.yaml" ]; then
            sandbox inspect "$run" --device cuda 2>&1 | tee -a "$OUT/inspect.txt"
        else
            sandbox inspect "$run" --device cuda --no-tensorboard --out "$OUT/inspect/$(basename "$run")" 2>&1 \
                | tee -a "$OUT/inspect.txt"
        fi
    done
    ;;
repeat)
    src="$1"; n="${2:-3}"; shift; shift || true
    dir="$OUT/repeat"
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -c "import json, sys, yaml; c = json.load(open(sys.argv[1]))['config']; c['name'] = 'repeat'
yaml.safe_dump(c, open(sys.argv[2], 'w'))" "$src" "$dir/config.yaml" || exit 1
    for i in $(seq 1 "$n"); do
        caches=(); [ "${COLD:-}" = 1 ] && caches=(TORCHINDUCTOR_CACHE_DIR="$dir/cache/$i/inductor" \
                                                   TRITON_CACHE_DIR="$dir/cache/$i/triton")
        env "${caches[@]}" python3 -m sandbox.cli train "$dir/config.yaml" --out "$dir/$i" --no-progress \
            "$@" 2>&1 | tail -n 2
    done
    rm -rf "$dir/cache"
    python3 - "$src" "$dir" > "$OUT/repeat.txt" <<'EOF'
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
    ref=$(ref_dir) || exit 1
    if [ -n "$ref" ]; then
        echo "--- the same with $ref's sandbox" | tee -a "$OUT/$name.txt"
        PYTHONPATH="$PWD/$ref${PYTHONPATH#"$PWD"}" python3 "benchmarks/$name.py" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    fi
    ;;
*)
    sed -n "2,35p" "$0"
    exit 2
    ;;
esac
