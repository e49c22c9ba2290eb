"""``sandbox sweep FILE.yaml`` and ``sandbox sweep status DIR``."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path


def cmd_sweep(args) -> int:
    from sandbox.sweep import report
    from sandbox.sweep.runner import _public_url, run_sweep
    from sandbox.sweep.spec import load_sweep
    from sandbox.sweep.storage import EXIT_STORAGE, StorageUnavailable

    if args.storage_timeout <= 0:
        raise ValueError(f"--storage-timeout: must be > 0 seconds, got {args.storage_timeout:g}")
    if args.target[0] == "status":
        if len(args.target) != 2:
            raise ValueError("usage: sandbox sweep status SWEEP_DIR")
        try:
            return report.status(Path(args.target[1]), args.storage, args.storage_timeout)
        except StorageUnavailable as e:
            print(f"sandbox: error: {e}", file=sys.stderr)
            return EXIT_STORAGE
    if len(args.target) != 1:
        raise ValueError("usage: sandbox sweep FILE.yaml  |  sandbox sweep status SWEEP_DIR")
    for flag in ("workers", "workers_per_gpu", "heartbeat", "stack"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {v}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise ValueError(f"--time-limit: must be > 0 seconds, got {args.time_limit:g}")
    spec = load_sweep(args.target[0], args.set)
    if args.retrain:
        from sandbox.sweep.study import retrain_matcher
        retrain_matcher(spec, args.retrain)        # a condition no trial meets is an error before anything starts
    if args.dry_run:
        return report.print_points(spec)
    out = Path(args.out) if args.out else Path("sweeps_out") / spec.name
    try:
        return run_sweep(spec, out, storage_url=args.storage, workers=args.workers,
                         workers_per_gpu=args.workers_per_gpu, heartbeat=args.heartbeat,
                         live=False if args.no_live else None, retry_failed=args.retry_failed,
                         storage_timeout=args.storage_timeout, stack=args.stack, time_limit=args.time_limit,
                         retrain=args.retrain or ())
    except StorageUnavailable as e:
        again = ["sandbox", "sweep", str(args.target[0]), *[a for o in args.set for a in ("--set", o)], "--out",
                 str(out)]
        if args.storage:
            again += ["--storage", _public_url(args.storage)]
        print(f"sandbox: error: {e}; the sweep stopped and its running trials saved checkpoints; to resume, "
              f"rerun `{shlex.join(again)}` (with the same other options) once the storage is back",
              file=sys.stderr, flush=True)
        return EXIT_STORAGE
    except OSError as e:         # the sweep directory cannot be written (read-only, full)
        where = f"{e.filename}: " if e.filename else f"{out}: "
        print(f"sandbox: error: {where}{e.strerror or e}", file=sys.stderr, flush=True)
        return 1


def add_cli(sub) -> None:
    s = sub.add_parser("sweep", help="run a sweep YAML on Optuna (or: sweep status DIR)",
                       description="Run every trial of a sweep YAML (each grid point with each tuned value) as an "
                                   "Optuna trial in worker processes; rerunning the same command resumes. "
                                   "`sandbox sweep status DIR` shows progress.")
    s.add_argument("target", nargs="+", metavar="FILE.yaml | status DIR",
                   help="a sweep YAML to run (or resume), or `status DIR` for a sweep directory's progress")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the sweep's base config, e.g. --set train.steps=500 (repeatable); the "
                   "variant is its own study (the sweep's name plus a hash of the overrides), resumed by the same "
                   "--set")
    s.add_argument("--out", help="sweep directory (default sweeps_out/<sweep name>)")
    s.add_argument("--workers", type=int, help="number of worker processes (default: 1 on CPU, "
                   "--workers-per-gpu x GPUs otherwise)")
    s.add_argument("--workers-per-gpu", type=int, help="worker processes per visible GPU, under CUDA MPS (default: "
                   "two, and one more while a GPU stays under 60%% busy with its workers training; one with "
                   "--time-limit or where MPS cannot be started)")
    s.add_argument("--stack", type=int, help="trials trained together in one worker as stacked replicas, at most "
                   "(default: the trials of a grid point and its other seeds, up to 12); 1 trains them one by one")
    s.add_argument("--storage", help="shared Optuna storage, e.g. postgresql://user:pw@host/db "
                   "(default: a journal file in the sweep directory)")
    s.add_argument("--heartbeat", type=int, help="seconds between worker heartbeats with --storage "
                   "(default 10; a trial is retried after 3 missed)")
    s.add_argument("--storage-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="how long the launcher and its workers wait out an unreachable storage (a database "
                   "restart, a full disk) before the sweep stops to be resumed (default 600); training "
                   "goes on meanwhile")
    s.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop after SECONDS: workers start only trials that finish by then at the pace measured "
                   "for their kind of stack (in this run, or from the sweep's finished trials), stacking fewer "
                   "near the end; once nothing fits, what waits trains up to the limit anyway and goes on from its "
                   "checkpoint in the next run (same --out)")
    s.add_argument("--dry-run", action="store_true", help="validate and list the trials, run nothing")
    s.add_argument("--retry-failed", action="store_true", help="queue failed trials again (e.g. after "
                   "fixing what made them fail); complete ones are kept")
    s.add_argument("--retrain", action="append", metavar="KEY=VALUE",
                   help="train the finished trials whose grid or tuned KEY is VALUE again (e.g. after a fix to a "
                   "kernel they trained on; repeat for several conditions, all must hold); their earlier trials "
                   "stay in the study as superseded, out of the verdicts, plots and best values. Once per set of "
                   "conditions: rerunning with the same ones resumes")
    s.add_argument("--no-live", action="store_true", help="print progress lines instead of a live table")
    s.set_defaults(func=cmd_sweep)
