"""``sandbox lte-eval RUN_DIR``: a trained LTE model scored through its capped inference cache
(``sandbox/mixers/lte_cache.py``), optionally on longer sequences than it was trained on."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from sandbox.mixers.lte import LearnableTokenEviction, use_cache
from sandbox.train import evaluate


def evaluate_with_cache(model, task, batch_size: int = 64, splits=("val", "test")) -> dict:
    """Accuracy/loss of ``model`` on ``task``'s held-out ``splits`` (any seq_len: the model has no learned
    positions by default) with every LTE layer decoding through its capped cache."""
    was_training = model.training
    with use_cache(model):
        metrics = evaluate(model, task, batch_size, nullcontext, splits)    # (evaluate ends in train mode)
    model.train(was_training)
    return metrics


def score_run(run_dir, device="auto", batch_size: int = 64, overrides=()) -> dict:
    """A trained LTE run scored twice on its test split, from its weights at the step chosen on val (else its final
    checkpoint: ``train.loop.weights_file``): with the training mask (every token scoring r > 0.5 kept, no cap) and
    through the capped cache. Returns ``step`` (of the weights), ``seq_len``, ``mask`` and ``capped`` (test
    accuracy), and per LTE layer its ``cap``, ``window``, ``sinks``,
    ``kept`` (out-of-window tokens the mask keeps per head at the last position, mean over one test batch) and
    ``held`` (the cache's out-of-window entries per head there). ``overrides``: ``task.KEY=VALUE`` changes."""
    from sandbox.analysis.capture import load_run
    from sandbox.config import config_from_dict, parse_override, set_dotted, to_dict
    from sandbox.tasks import make_task

    run = load_run(run_dir, device)
    model = run.model
    raw = to_dict(run.cfg)
    raw["task"] = dict(raw["task"])
    for item in overrides:
        key, value = parse_override(item)
        if not key.startswith("task."):
            raise ValueError(f"--set: only task.* keys can change at evaluation, got {key}")
        set_dotted(raw, key, value)
    task = make_task(config_from_dict(raw, "--set").task.params, seed=run.cfg.seed, device=run.task.device)
    layers = [m for m in model.modules() if isinstance(m, LearnableTokenEviction)]
    if not layers:
        raise ValueError(f"run_dir: {run_dir} has no lte layer")
    model.eval()
    masked = evaluate(model, task, batch_size, nullcontext, splits=("test",))
    x, _ = next(iter(task.test_batches(batch_size)))
    for m in layers:
        m.capture = {}
    model.eval()
    with torch.no_grad():
        model(x)
    kept = [m.capture["retained_count"].tolist() for m in layers]
    capped = evaluate_with_cache(model, task, batch_size, splits=("test",))
    with use_cache(model), torch.no_grad():
        model(x)
    held = [m.capture["retained_count"].tolist() for m in layers]
    for m in layers:
        m.capture = None
    return {"step": run.step, "seq_len": task.seq_len, "mask": masked["test/accuracy"], "capped": capped["test/accuracy"],
            "layers": [{"cap": m.cfg.cap, "window": m.cfg.window, "sinks": m.cfg.sinks, "kept": k, "held": h}
                       for m, k, h in zip(layers, kept, held)]}


def cmd_lte_eval(args) -> int:
    """``sandbox lte-eval RUN_DIR [--set task.seq_len=8192]``: accuracy with the training mask
    (uncapped retention) and through the capped cache, plus retention per head of each LTE layer."""
    res = score_run(args.run_dir, args.device, args.batch_size, args.set)
    print(f"seq_len {res['seq_len']}: accuracy {res['mask']:.4f} with the training mask, "
          f"{res['capped']:.4f} through the capped cache")
    for i, layer in enumerate(res["layers"]):
        print(f"lte layer {i}: kept per head (uncapped) {[round(v, 1) for v in layer['kept']]}; "
              f"cache occupancy {[round(v, 1) for v in layer['held']]} (cap {layer['cap']})")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("lte-eval", help="evaluate an LTE run through its capped inference cache "
                                        "(optionally on longer sequences)")
    p.add_argument("run_dir", help="a run directory written by `sandbox train` with lte layers")
    p.add_argument("--set", action="append", default=[], metavar="task.KEY=VALUE",
                   help="change the task, e.g. --set task.seq_len=8192 (repeatable)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per evaluation batch (default 64)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    p.set_defaults(func=cmd_lte_eval)
