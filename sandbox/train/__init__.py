"""Training. ``train(cfg, out)``: one run. ``train_replicas(cfgs, outs)``: runs that differ only in learning rate and
seed, trained as one stacked model, each with its own directory and result.

The learning:
loop.py        the run loop: start-up phases, early stop, checkpoints, TensorBoard, results
step.py        one step of R replicas: vmap over stacked weights, the learning-rate schedule, one CUDA graph
adamw.py       the replicas' weights as one [R, P] tensor, and AdamW with per-replica clipping over it
evaluation.py  test accuracy and loss, of one model or of a stack's replicas in one forward
group.py       what a stack of runs trains with (models, step, batch pools), when to regroup

The runtime around it:
compile.py     whether a run compiles its step (``train.compile: auto``), Inductor's settings, torch's caches
progress.py    what a user watches: the start-up phases, then the training bar
signals.py     Ctrl-C and SIGTERM held to the next step boundary
files.py       files written whole (results, checkpoints), checkpoints in the background
"""
from sandbox.train.group import Group, Unstackable, build, resolve_device, stack_key, use_cuda_graph
from sandbox.train.evaluation import evaluate
from sandbox.train.loop import StopTraining, TrainingDiverged, ended_result, train, train_replicas
from sandbox.train.step import Step, graph_safe, lr_lambda, scored_positions

__all__ = ["Group", "StopTraining", "TrainingDiverged", "Unstackable", "build", "ended_result", "evaluate",
           "resolve_device", "stack_key", "train", "train_replicas", "use_cuda_graph", "Step", "graph_safe",
           "lr_lambda", "scored_positions"]
