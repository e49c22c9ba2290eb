"""Subcommands ``sandbox inspect``, ``sandbox plot``, ``sandbox verdict`` and ``sandbox compare``."""
from __future__ import annotations

import argparse


def cmd_inspect(args) -> int:
    from pathlib import Path

    from sandbox.analysis.report import inspect_run, inspect_sweep
    if (Path(args.run_dir) / "sweep.yaml").is_file():        # a figure's sweep: its state pictures
        return 0 if inspect_sweep(args.run_dir, device=args.device, batches=args.batches,
                                  batch_size=args.batch_size, figure=args.figure) else 1
    inspect_run(args.run_dir, layer=args.layer, batches=args.batches, batch_size=args.batch_size,
                tsne=args.tsne, out=args.out, device=args.device, tensorboard=not args.no_tensorboard)
    return 0


def cmd_plot(args) -> int:
    from sandbox.analysis.plot_sweep import plot_sweep
    plot_sweep(args.sweep_dir, x=args.x, y=args.y, hue=args.hue, col=args.col, heatmap=args.heatmap,
               spread=args.spread, out=args.out, where=args.where, logx=args.logx)
    return 0


def cmd_verdict(args) -> int:
    from sandbox.analysis.verdicts import report
    print(report(*args.sweep_dir, figure=args.figure, plan=args.plan, power=args.power))
    return 0


def cmd_compare(args) -> int:
    from sandbox.analysis.compare import compare
    compare(args.a, args.b, seeds=args.seeds, task=args.task, sets=args.set, set_a=args.set_a,
            set_b=args.set_b, metric=args.metric, margin=args.margin, out=args.out, jobs=args.jobs,
            progress=args.progress)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("inspect", help="pictures of what a trained run's state learned (SSE Figs. 2, 3, 5, 9)")
    p.add_argument("run_dir", help="a run directory written by `sandbox train` (holds checkpoint.pt), or a "
                                   "figure's sweep directory: the state pictures of the runs its criteria name, "
                                   "into SWEEP_DIR/state_pictures/")
    p.add_argument("--figure", help="the figure folder whose verdict.py names the state pictures (PICTURE_RUNS), "
                                    "where the sweep directory does not find it (see `sandbox verdict --help`)")
    p.add_argument("--layer", type=int, help="only this layer (default: all)")
    p.add_argument("--batches", type=int, default=4, help="test batches to run (default 4)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per batch (default 64)")
    p.add_argument("--tsne", action="store_true", help="place tokens by t-SNE instead of PCA (slower)")
    p.add_argument("--out", help="output folder (default RUN_DIR/inspect)")
    p.add_argument("--device", default="auto", help="auto (default: the GPU if there is one), cpu, cuda or cuda:N")
    p.add_argument("--no-tensorboard", action="store_true", help="do not add the figures to the run's TensorBoard")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("plot", help="curves or heatmaps from a sweep directory (results.csv or */result.json)")
    p.add_argument("sweep_dir", help="a directory written by `sandbox sweep` (its results.csv), or any folder "
                                     "holding run directories (their */result.json)")
    p.add_argument("--x", required=True, help="x axis key, e.g. model.d_model, task.gap, state_size")
    p.add_argument("--y", default="test/accuracy", help="metric (default test/accuracy: the test accuracy at the "
                   "learning rate and step chosen on val, as the verdicts read it; best test accuracy for runs from "
                   "before the val split)")
    p.add_argument("--hue", help="one line per value of this key, e.g. model.mixer")
    p.add_argument("--col", help="one panel per value of this key, e.g. task.gap")
    p.add_argument("--heatmap", metavar="KEY", help="draw a heatmap with KEY as rows and --x as columns "
                                                   "(colour = --y), e.g. --x model.sse.k --heatmap model.sse.n")
    p.add_argument("--spread", choices=("minmax", "std", "ci"), default="minmax",
                   help="band over seeds: min..max (default), mean ± std, or the mean's 95%% t interval (ci)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only rows with this value (repeatable)")
    p.add_argument("--logx", action=argparse.BooleanOptionalAction, default=None,
                   help="logarithmic x axis (default: on for learning rates, e.g. --x train.lr, and for numbers "
                        "spanning a factor of 8 or more)")
    p.add_argument("--out", help="PNG path (default SWEEP_DIR/plots/<y>_vs_<x>....png)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("verdict", help="a figure's claims judged by the criteria fixed before it ran "
                                       "(figures/NAME/README.md), from its sweep directory")
    p.add_argument("sweep_dir", nargs="+", help="a figure's sweep directory, e.g. figures/NAME or "
                   "sweeps_out/NAME, or the directories its parts ran into (their trials pooled)")
    p.add_argument("--figure", help="the figure folder (figures/NAME) whose verdict.py judges the sweep; by default "
                   "the sweep directory or the folder above it, else the folder of the sweep file it ran from")
    p.add_argument("--plan", action="store_true", help="read the run as a pilot: print the seeds per cell each "
                   "comparison needs for its expected effect, instead of the verdicts")
    p.add_argument("--power", type=float, default=0.8, help="the chance of holding that --plan plans for "
                   "(default 0.8)")
    p.set_defaults(func=cmd_verdict)

    p = sub.add_parser("compare", help="train two variants over several seeds: the effect, its interval, n and a "
                                       "verdict, as `sandbox verdict` words them",
                       description="A and B are run YAML files, or mixer variants written NAME[+KEY=VALUE...] "
                                   "(options of model.NAME), e.g. `sandbox compare attention gla+conv_size=4 --seeds "
                                   "3`. It prints the task with its chance level and the training before the "
                                   "results, warns when a variant sits at chance, and judges B - A against --margin: "
                                   "B better, A better, no difference, or inconclusive with the seeds that would "
                                   "decide it.")
    p.add_argument("a", help="variant A: a YAML file or NAME[+KEY=VALUE...]")
    p.add_argument("b", help="variant B: a YAML file or NAME[+KEY=VALUE...]")
    p.add_argument("--seeds", type=int, default=5, help="seeds per variant (default 5)")
    p.add_argument("--task", default="tiny",
                   help="base run for mixer variants: a preset or a YAML file. Presets: tiny (default; MQAR of 4 "
                        "pairs in 32 tokens, 1000 steps: attention learns it on a CPU in about a minute), fig8 (the "
                        "task, model and recipe of SSE's Figure 8 with zero tokens: a GPU's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for both variants")
    p.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE", help="override for A only")
    p.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE", help="override for B only")
    p.add_argument("--metric", choices=("test_at_best_val", "best_accuracy", "final_accuracy"),
                   default="test_at_best_val", help="what each run contributes: its test accuracy at the step chosen "
                   "on val (default, as `sandbox verdict` reads it), its best test accuracy over the evaluations (the "
                   "step chosen on test), or its accuracy at the last step")
    p.add_argument("--margin", type=float, default=0.05, help="the smallest effect worth reporting (default 0.05): "
                   "B better when the 95%% interval of B - A lies above it, A better when below minus it, no "
                   "difference when inside; a variant within it of chance sits at chance")
    p.add_argument("--jobs", type=int, help="variants trained at once, each its seeds as one stack (default: 2 on a "
                   "GPU, side by side; 1 on the CPU)")
    p.add_argument("--out", help="folder for the runs (default runs/compare-<time>); rerunning resumes")
    p.add_argument("--progress", action="store_true", help="show each run's progress bar")
    p.set_defaults(func=cmd_compare)
