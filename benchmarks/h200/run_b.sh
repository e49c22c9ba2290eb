# H200 run B (after the run A fixes): Zoology attention points (issue 2) and steps/s at
# (512, 64) batch 128; the linear family table with and without top-k (issue 3, also the
# many-workers sweep of issue 6); GLA vs top-k GLA state pictures (issue 7).
source benchmarks/h200/setup.sh
W=/tmp/work; mkdir -p $W
python3 - <<'PY'
import yaml
base = yaml.safe_load(open("sweeps/foundation_attention.yaml"))["base"]
base["task"].update(seq_len=512, num_kv_pairs=64)
base["train"].update(batch_size=128, steps=300, early_stop=None, eval_every=300, lr=1e-3)
yaml.safe_dump(base, open("/tmp/work/sps.yaml", "w"))
PY
timeout 60 python3 -m sandbox.cli train /tmp/work/sps.yaml --out $W/sps --no-progress | tail -2
T0=$(date +%s)
pids=()
timeout -s INT 490 python3 -m sandbox.cli sweep sweeps/foundation_attention.yaml --out $W/foundation_attention --workers-per-gpu 3 --no-live > $W/fa.log 2>&1 & pids+=($!)
timeout -s INT 490 python3 -m sandbox.cli sweep sweeps/linear_family.yaml --out $W/linear_family --workers-per-gpu 6 --no-live > $W/lf.log 2>&1 & pids+=($!)
timeout -s INT 490 python3 -m sandbox.cli sweep sweeps/linear_family_topk.yaml --out $W/linear_family_topk --workers-per-gpu 6 --no-live > $W/lft.log 2>&1 & pids+=($!)
timeout 490 python3 benchmarks/inspect_topk.py --steps 3000 --batch-size 256 --lr 2e-3 --out $W/inspect_topk --docs $W/docs > $W/inspect.log 2>&1 & pids+=($!)
wait "${pids[@]}"
echo "sweeps done after $(( $(date +%s) - T0 )) s"
for s in foundation_attention linear_family linear_family_topk; do python3 -m sandbox.cli sweep status $W/$s > $W/$s.status 2>&1; done
for f in fa lf lft inspect; do echo "== $f"; grep -v "^[0-9:]* [0-9]*/[0-9]* finished" $W/$f.log | tail -22 | cut -c1-220; done
cd $W && tar czf $OUT/run_b.tgz --exclude='*.pt' --exclude='*.journal' . && ls -la $OUT
