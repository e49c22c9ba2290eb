"""Training. ``train(cfg, out)``: one run. ``train_replicas(cfgs, outs)``: runs that differ only in
learning rate and seed, trained as one stacked model, each with its own directory and result.

loop.py   the run loop: early stop, checkpoints, TensorBoard, results
evaluation.py  test accuracy and loss, of one model or of a stack's replicas in one forward
group.py  what a stack of runs trains with (models, step, batch pools), whether to compile, when to regroup
step.py   one step of R replicas: vmap over stacked weights, the learning-rate schedule, one CUDA graph
adamw.py  the replicas' weights as one [R, P] tensor, and AdamW with per-replica clipping over it
precompile.py  helper processes that compile the steps of a worker's next stacks while it trains
"""
from sandbox.train.group import Group, build, resolve_device, stack_key, use_compile, use_cuda_graph
from sandbox.train.evaluation import evaluate
from sandbox.train.loop import StopTraining, TrainingDiverged, train, train_replicas
from sandbox.train.step import Step, graph_safe, lr_lambda, scored_positions

__all__ = ["Group", "StopTraining", "TrainingDiverged", "build", "evaluate", "resolve_device", "stack_key", "train",
           "train_replicas", "use_compile", "use_cuda_graph", "Step", "graph_safe", "lr_lambda", "scored_positions"]
