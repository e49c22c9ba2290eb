"""The ``sandbox`` command.

    sandbox train [CONFIG] [--set KEY=VALUE ...] [--out DIR]

Errors in the user's input print one line and exit with status 2. A command that takes a subcommand
(``sandbox``, ``sandbox bench``) prints its help when given none, and exits with 0: asking what there is
is not a mistake.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from importlib import resources
from pathlib import Path


# Modules that contribute subcommands; each defines add_cli(subparsers) and sets
# `func` on its parser (a function args -> exit code).
SUBCOMMAND_MODULES: list[str] = ["sandbox.analysis.cli", "sandbox.sweep.cli", "sandbox.analysis.lte_eval",
                                  "sandbox.bench"]


def _error(msg: str, code: int = 2) -> int:
    print(f"sandbox: error: {msg}", file=sys.stderr)
    return code


def quickstart_path() -> Path:
    return Path(str(resources.files("sandbox") / "configs" / "quickstart.yaml"))


def cmd_train(args) -> int:
    from sandbox.config import load_config
    from sandbox.train import TrainingDiverged, train

    path = Path(args.config) if args.config else quickstart_path()
    cfg = load_config(path, args.set)
    out = Path(args.out) if args.out else Path("runs") / f"{cfg.name or path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"run directory: {out}")
    try:
        res = train(cfg, out, progress=not args.no_progress)
    except TrainingDiverged as e:
        return _error(f"{out}: training diverged: {e}", 1)
    except KeyboardInterrupt:
        return _error(f"{out}: interrupted at a checkpoint; rerun with --out {out} to resume", 130)
    acc = res["final_accuracy"]
    print(f"{res['status']}: test accuracy {acc:.4f} (best {res['best_accuracy']:.4f} at step "
          f"{res['best_step']}) after {res['steps']} steps in {res['wall_time_s']:.1f} s "
          f"({res['steps_per_sec']} steps/s); {res['params']:,} parameters, state {res['state_size']:,} "
          f"elements\nresult: {out / 'result.json'}   tensorboard --logdir {out}")
    return 0


def _print_help(parser: argparse.ArgumentParser):
    """The ``func`` of a command whose subcommand is missing: its help, on stdout."""
    def show(_args) -> int:
        parser.print_help()
        return 0
    return show


def _with_subcommands(parser: argparse.ArgumentParser):
    """``parser`` and every parser below it that takes a subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield parser
            for child in dict.fromkeys(action.choices.values()):
                yield from _with_subcommands(child)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sandbox", description="Train and inspect token mixers on synthetic tasks.",
        epilog="Start with `sandbox train` (the packaged quickstart, under a minute on a CPU), then "
               "`sandbox inspect RUN_DIR` on the run directory it prints. `sandbox COMMAND --help` lists a "
               "command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train one model from a YAML config",
                       description="Train one model from a run YAML; the run directory gets TensorBoard events, "
                                   "result.json, a checkpoint that a second call with the same --out resumes, and "
                                   "the weights at the step chosen on val (chosen.pt), which analyses load.")
    t.add_argument("config", nargs="?", help="run YAML (default: the packaged quickstart, "
                                             "sandbox/configs/quickstart.yaml)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set model.d_model=128 (repeatable)")
    t.add_argument("--out", help="run directory (default runs/<name>-<time>); an existing one resumes")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)
    for module in SUBCOMMAND_MODULES:        # each adds its subcommand through add_cli(sub)
        importlib.import_module(module).add_cli(sub)
    for parser in _with_subcommands(p):      # `sandbox`, `sandbox bench`: no subcommand given -> the help
        parser.set_defaults(func=_print_help(parser))
    return p


def main(argv=None) -> int:
    from sandbox.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        return _error(str(e))
    except ValueError as e:          # e.g. an out dir holding another config's checkpoint
        return _error(str(e))
    except RuntimeError as e:
        if "out of memory" in str(e).lower():
            return _error(f"GPU out of memory: {str(e).splitlines()[0]}", 1)
        raise


if __name__ == "__main__":
    sys.exit(main())
