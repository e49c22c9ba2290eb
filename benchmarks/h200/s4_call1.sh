# Session 3, first call (one H200, alone): is the chunk-parallel backward right on Hopper and
# faster than the one it replaces (kept in _ab/old, carried), does a CUDA-graph step train the
# same weights as eager, and what do graphs do to whole training steps (issue 5's 5x target,
# issue 3's steps/s).
source benchmarks/h200/setup.sh
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_graph_step.py 2>&1 | tail -4 | tee $OUT/graph_tests.txt
timeout 200 python3 -m sandbox.cli bench kernels --check --no-fla --no-sse --gates diag --shapes "$S" \
  --deadline 180 --out $OUT/bench_new.json > $OUT/bench_new.txt 2>&1; tail -45 $OUT/bench_new.txt
(cd _ab/old && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m sandbox.cli bench kernels --no-fla --no-sse \
  --no-torch --gates diag --shapes "$S" --deadline 90 --out $OUT/bench_old.json > $OUT/bench_old.txt 2>&1); tail -22 $OUT/bench_old.txt
timeout 120 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
  --impls triton,torch --graphs on,off --profile > $OUT/profile_gla.txt 2>&1; grep -E "ms/step|sampling|ratio|Self CUDA" $OUT/profile_gla.txt
P="timeout 60 python3 benchmarks/profile_step.py --d-model 128 --heads 2 --seq-len 256 --kv 16 --batch 256 --impls triton --graphs on,off --steps 10"
( $P --mixer gla; $P --mixer gsa; $P --mixer gsa --set model.gsa.topk=16; $P --mixer gated_deltanet --set model.gated_deltanet.topk=16; $P --mixer deltanet ) 2>&1 | grep -E "ms/step|Error|error" | tee $OUT/steps_alone.txt
