# H200 run A: task bits CPU == CUDA; Zoology attention points (issue 2); the linear family
# table with and without top-k (issue 3, also the multi-worker sweep of issue 6); GLA vs
# top-k GLA state pictures (issue 7); attention steps/s at (512, 64), batch 128.
source benchmarks/h200/setup.sh
W=/tmp/work; mkdir -p $W
python3 - <<'PY' 2>&1 | tee $OUT/determinism.txt
import torch
from sandbox.tasks import make_task
for kw in [dict(seq_len=256, num_kv_pairs=16), dict(seq_len=512, num_kv_pairs=64, noise=64)]:
    a = make_task("mqar", vocab_size=8192, seed=3, device="cpu", **kw)
    b = make_task("mqar", vocab_size=8192, seed=3, device="cuda", **kw)
    for split, idx in (("train", 0), ("train", 12345), ("test", 1)):
        xa, ya = a.sample(128, split, idx); xb, yb = b.sample(128, split, idx)
        print(kw, split, idx, "identical:", torch.equal(xa, xb.cpu()) and torch.equal(ya, yb.cpu()))
PY
T0=$(date +%s)
pids=()
timeout 470 python3 -m sandbox.cli sweep sweeps/foundation_attention.yaml --out $W/foundation_attention --workers-per-gpu 4 --no-live > $W/fa.log 2>&1 & pids+=($!)
timeout 470 python3 -m sandbox.cli sweep sweeps/linear_family.yaml --out $W/linear_family --workers-per-gpu 6 --no-live > $W/lf.log 2>&1 & pids+=($!)
timeout 470 python3 -m sandbox.cli sweep sweeps/linear_family_topk.yaml --out $W/linear_family_topk --workers-per-gpu 6 --no-live > $W/lft.log 2>&1 & pids+=($!)
timeout 470 python3 benchmarks/inspect_topk.py --steps 2500 --lr 2e-3 --out $W/inspect_topk --docs $W/docs > $W/inspect.log 2>&1 & pids+=($!)
nvidia-smi dmon -s u -d 5 > $W/dmon.log 2>&1 & dmon=$!
wait "${pids[@]}"
echo "sweeps done after $(( $(date +%s) - T0 )) s"
kill $dmon 2>/dev/null
python3 - <<'PY'
import yaml, json, subprocess
base = yaml.safe_load(open("sweeps/foundation_attention.yaml"))["base"]
base["task"].update(seq_len=512, num_kv_pairs=64); base["train"].update(batch_size=128, steps=400, early_stop=None, eval_every=400, lr=1e-3)
yaml.safe_dump(base, open("/tmp/work/sps.yaml", "w"))
PY
timeout 90 python3 -m sandbox.cli train /tmp/work/sps.yaml --out $W/sps --no-progress | tail -2
for f in fa lf lft inspect; do echo "== $f"; tail -25 $W/$f.log; done
awk 'NR>2 {s+=$2; n++} END {if (n) print "mean GPU util (dmon sm%)", s/n, "over", n, "samples"}' $W/dmon.log
cd $W && tar czf $OUT/run_a.tgz --exclude='*.pt' --exclude='*.journal' . && ls -la $OUT
