# Session 3, second call (one H200, alone): CUDA-graph parity for every mixer kind (the delta rule's
# host sync is gone), steps/s of the delta-rule rows, tile sizes of the intra-chunk kernels, then
# fla's chunk_gla beside ours at the five issue shapes (fla autotunes for minutes per head dim).
source benchmarks/h200/setup.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_graph_step.py 2>&1 | tail -6 | tee $OUT/graph_tests.txt
P="timeout 60 python3 benchmarks/profile_step.py --d-model 128 --heads 2 --seq-len 256 --kv 16 --batch 256 --graphs on,off --steps 10"
( $P --mixer gated_deltanet --set model.gated_deltanet.topk=16 --impls auto; $P --mixer deltanet --impls triton; $P --mixer gated_deltanet --impls triton ) 2>&1 | grep -E "ms/step|Error" | tee $OUT/steps_alone2.txt
timeout 170 python3 benchmarks/intra_configs.py --shapes "128,512,2,64,128;8,4096,4,128,128" > $OUT/intra_configs.txt 2>&1; grep "==" $OUT/intra_configs.txt
S="64,512,2,64;64,512,2,256;16,2048,2,256;8,4096,4,128;8,2048,2,512"
timeout 200 python3 -m sandbox.cli bench kernels --gates diag --no-sse --no-torch --no-profile --shapes "$S" \
  --deadline 190 --out $OUT/bench_fla.json > $OUT/bench_fla.txt 2>&1; tail -12 $OUT/bench_fla.txt
