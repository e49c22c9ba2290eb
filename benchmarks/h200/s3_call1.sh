# Next session, first call (x8): start s3_jobs.sh detached on GPUs 1-7; GPU 0 measures alone:
# the whole step with TrainBatches (issue 5's 5x target), GSA and Gated DeltaNet top-k steps/s
# and peak memory (issue 3), and where the diagonal-gate backward spends its time at the shape
# where fla is faster, with fla's chunk_gla in the same process (its autotune takes minutes).
source benchmarks/h200/setup.sh
rm -rf /tmp/repo && cp -a . /tmp/repo && mkdir -p /tmp/work/logs
setsid nohup bash /tmp/repo/benchmarks/h200/s3_jobs.sh > /tmp/work/logs/jobs.log 2>&1 < /dev/null &
export CUDA_VISIBLE_DEVICES=0
G=/tmp/work/gpu0; mkdir -p $G
P="python3 benchmarks/profile_step.py --d-model 128 --heads 2 --seq-len 256 --kv 16 --batch 256 --impls triton --steps 10"
timeout 120 python3 benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 --impls triton,torch --profile > $G/profile_gla.txt 2>&1; grep -E "ms/step|sampling|ratio" $G/profile_gla.txt
(timeout 60 $P --mixer gsa; timeout 60 $P --mixer gsa --set model.gsa.topk=16; timeout 60 $P --mixer gated_deltanet --set model.gated_deltanet.topk=16) 2>&1 | grep ms/step | tee $G/steps_alone_rest.txt
timeout 300 python3 -m sandbox.cli bench kernels --shapes "8,4096,4,128" --gates diag --no-sse --no-torch --out $G/bench_fla.json > $G/bench_fla.txt 2>&1; tail -20 $G/bench_fla.txt
bash benchmarks/h200/s2_collect.sh 0
