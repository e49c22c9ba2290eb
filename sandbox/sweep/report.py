"""What a sweep shows and writes: the live table, ``results.csv``, the per-grid-point
summary (``summary.csv``, ``summary.md``) and ``sandbox sweep status``. Everything is
computed from the Optuna study alone, so any machine sharing the storage can report on
the whole sweep.
"""
from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from sandbox.sweep.storage import DEFAULT_TIMEOUT_S
from sandbox.sweep.study import superseded

RESULT_KEYS = ("final_accuracy", "best_accuracy", "best_step", "steps", "wall_time_s", "train_time_s", "setup_s",
               "eval_s", "steps_per_sec", "replicas", "compiled_at", "precompiled", "params", "state_size",
               "device")


def make_console():
    """A rich console; wide when writing to a file or pipe so tables are not squeezed."""
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=200)


# ---- rows ------------------------------------------------------------------------------------

def retries_by_origin(trials) -> dict[int, object]:
    return {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}


def status_of(t, retried: dict | None = None, gone: dict | None = None) -> str:
    a = t.user_attrs
    if gone and t.number in gone:
        return "superseded"
    if t.state == TrialState.FAIL:
        if "duplicate_of" in a:
            return "duplicate"
        if "failure" in a:
            return "failed"
        return "requeued" if retried and t.number in retried else "lost"
    return {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.RUNNING: "running",
            TrialState.WAITING: "waiting"}[t.state]


def _note(t, retried: dict, gone: dict) -> str:
    a = t.user_attrs
    if t.number in gone:
        nxt = gone[t.number]
        return f"trained again as trial {nxt.number} ({nxt.user_attrs.get('retrain_reason', '--retrain')})"
    if "duplicate_of" in a:
        return f"duplicate of trial {a['duplicate_of']}"
    if t.state == TrialState.FAIL and "failure" not in a:
        nxt = retried.get(t.number)
        reason = a.get("lost") or (nxt.user_attrs.get("retry_reason") if nxt else "") or "lost"
        return f"{reason}; requeued as trial {nxt.number}" if nxt else reason
    note = a.get("failure") or a.get("pruned") or ""
    if "retry_of" in a and not note:
        note = f"retry of trial {a['retry_of']}"
    if "retrain_of" in a and not note:
        note = f"trains trial {a['retrain_of']} again ({a.get('retrain_reason', '--retrain')})"
    return note


def keys_of(trials) -> tuple[list[str], list[str]]:
    grid, tune = {}, {}
    for t in trials:
        grid.update(dict.fromkeys(t.user_attrs.get("grid", {})))
        tune.update(dict.fromkeys(t.user_attrs.get("tune", {})))
    return list(grid), list(tune)


def duration(t) -> float | None:
    if t.datetime_start and t.datetime_complete:
        return (t.datetime_complete - t.datetime_start).total_seconds()
    return None


def _cell(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return "" if v is None else v


def trial_rows(trials) -> list[dict]:
    grid_keys, tune_keys = keys_of(trials)
    retried, gone = retries_by_origin(trials), superseded(trials)
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        a, res = t.user_attrs, t.user_attrs.get("result") or {}
        status = status_of(t, retried, gone)
        row = {"trial": t.number, "status": status, "point_id": a.get("point_id", "")}
        row.update({k: a.get("grid", {}).get(k) for k in grid_keys})
        row.update({k: a.get("tune", {}).get(k) for k in tune_keys})
        row["sample"] = a.get("sample")
        row["objective"] = t.value if status == "complete" else None
        row.update({k: res.get(k) for k in RESULT_KEYS})
        d = duration(t)
        row["trial_time_s"] = round(d, 2) if d is not None else None
        row.update({"worker": a.get("worker", ""), "run_dir": a.get("run_dir", ""), "note": _note(t, retried, gone),
                    "grid_id": a.get("grid_id", "")})
        rows.append(row)
    return rows


def grid_summary(trials, direction: str) -> tuple[list[dict], list[str], list[str]]:
    """One row per grid point: the best objective over its tuned trials."""
    grid_keys, tune_keys = keys_of(trials)
    groups: dict[str, list] = {}
    for r in trial_rows(trials):
        if r["grid_id"]:
            groups.setdefault(r["grid_id"], []).append(r)
    sign = 1 if direction == "maximize" else -1
    out = []
    for rows in groups.values():
        done = [r for r in rows if r["objective"] is not None]
        best = max(done, key=lambda r: sign * r["objective"]) if done else None
        counts = {s: sum(r["status"] == s for r in rows) for s in ("complete", "pruned", "failed", "running",
                                                                  "waiting", "lost", "superseded")}
        row = {k: rows[0][k] for k in grid_keys}
        row["best"] = best["objective"] if best else None
        row.update({f"best {k}": best[k] if best else None for k in tune_keys})
        row.update({"trial": best["trial"] if best else None, "steps": best["steps"] if best else None,
                    "steps_per_sec": best["steps_per_sec"] if best else None,
                    "params": rows[0]["params"] or (best or {}).get("params"),
                    "state_size": rows[0]["state_size"] or (best or {}).get("state_size"),
                    "trials": " ".join(f"{n} {s}" for s, n in counts.items() if n)})
        out.append(row)
    return out, grid_keys, tune_keys


def seed_summary(summary: list[dict], grid_keys: list[str]) -> list[dict]:
    """Mean ± std of the per-point best over the `seed` axis."""
    if "seed" not in grid_keys:
        return []
    rest = [k for k in grid_keys if k != "seed"]
    groups: dict[str, list] = {}
    for r in summary:
        groups.setdefault(json.dumps([r[k] for k in rest], default=str), []).append(r)
    out = []
    for rows in groups.values():
        vals = [r["best"] for r in rows if r["best"] is not None]
        row = {k: rows[0][k] for k in rest}
        row.update({"mean": statistics.fmean(vals) if vals else None,
                    "std": statistics.stdev(vals) if len(vals) > 1 else 0.0 if vals else None,
                    "seeds": f"{len(vals)}/{len(rows)}"})
        out.append(row)
    return out


def counts(trials) -> dict:
    c = {s: 0 for s in ("complete", "pruned", "failed", "running", "waiting", "lost", "requeued", "duplicate",
                        "superseded")}
    retried, gone = retries_by_origin(trials), superseded(trials)
    for t in trials:
        c[status_of(t, retried, gone)] += 1
    return c


def best_trial(trials, direction: str):
    gone = superseded(trials)
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and t.number not in gone]
    if not done:
        return None
    return (max if direction == "maximize" else min)(done, key=lambda t: t.value)


def point_label(t) -> str:
    items = {**t.user_attrs.get("grid", {}), **t.user_attrs.get("tune", {})}
    return " ".join(f"{k}={_cell(v)}" for k, v in items.items()) or "(base)"


def progress_line(trials, direction: str, since: float | None = None, workers: int | None = None) -> str:
    c = counts(trials)
    total = c["complete"] + c["pruned"] + c["failed"] + c["running"] + c["waiting"] + c["lost"]
    parts = [f"{c['complete'] + c['pruned'] + c['failed']}/{total} finished ({c['complete']} complete, "
             f"{c['pruned']} pruned, {c['failed']} failed), {c['running']} running, {c['waiting']} waiting"
             + (f", {c['superseded']} superseded (trained again by --retrain)" if c["superseded"] else "")]
    b = best_trial(trials, direction)
    if b is not None:
        parts.append(f"best {b.value:.4f} (trial {b.number}: {point_label(b)})")
    eta = _eta(trials, since, workers)
    if eta is not None:
        parts.append(f"ETA {_hms(eta)}")
    return "; ".join(parts)


def _eta(trials, since, workers) -> float | None:
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                and duration(t) is not None and "duplicate_of" not in t.user_attrs]
    recent = [t for t in finished if since is None or t.datetime_start.timestamp() >= since] or finished
    c = counts(trials)
    if not recent or not (c["waiting"] + c["running"]):
        return None
    mean = statistics.fmean(duration(t) for t in recent)
    # the trials running now run at once (a worker's stack trains them together): that many at a time, not
    # one per worker (which overstated a sweep of stacks of 9 on 3 workers ninefold)
    return (c["waiting"] + 0.5 * c["running"]) * mean / max(1, c["running"] or workers or 1)


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ---- live display ------------------------------------------------------------------------

class Board:
    """A live rich table on a terminal; progress lines (on change, at most every 10 s) otherwise."""

    def __init__(self, console, name: str, t0: float, live: bool | None, direction: str = "maximize"):
        self.console, self.name, self.t0, self.direction = console, name, t0, direction
        self.live_enabled = console.is_terminal if live is None else live
        self.notes: list[str] = []
        self.live = None
        self.last_line, self.last_print = "", 0.0

    def __enter__(self):
        if self.live_enabled:
            from rich.live import Live
            self.live = Live(console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)

    def note(self, text: str) -> None:
        self.notes = (self.notes + [f"{time.strftime('%H:%M:%S')} {text}"])[-5:]
        if self.live is None:
            self.console.print(self.notes[-1], highlight=False)

    def update(self, trials, workers: int, gpu: str) -> None:
        line = progress_line(trials, self.direction, self.t0, workers)
        if self.live is None:
            if line != self.last_line and time.time() - self.last_print >= 10 or \
                    counts(trials)["running"] == 0 and line != self.last_line:
                self.console.print(f"{time.strftime('%H:%M:%S')} {line}" + (f"  [{gpu}]" if gpu else ""),
                                   highlight=False)
                self.last_line, self.last_print = line, time.time()
            return
        from rich.console import Group
        from rich.table import Table
        table = Table(title=f"running ({workers} workers)", title_justify="left", expand=False)
        for col in ("trial", "point", "worker", "elapsed", "last value"):
            table.add_column(col)
        now = time.time()
        for t in trials:
            if t.state == TrialState.RUNNING:
                last = t.intermediate_values[t.last_step] if t.last_step is not None else None
                table.add_row(str(t.number), point_label(t), t.user_attrs.get("worker", "?"),
                              _hms(now - t.datetime_start.timestamp()) if t.datetime_start else "",
                              "" if last is None else f"{last:.4f} @ {t.last_step}")
        head = f"[bold]{self.name}[/]  {_hms(now - self.t0)}  {line}" + (f"\nGPU: {gpu}" if gpu else "")
        self.live.update(Group(head, table, *self.notes))


# ---- files ------------------------------------------------------------------------------------

def _write_csv(path: Path, rows: list[dict], drop=()) -> None:
    cols = [c for c in (rows[0] if rows else {}) if c not in drop]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([_cell(r[c]) for c in cols])


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return "(none)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(_cell(r[c])) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def timing(trials, wall_s: float | None, since: float | None) -> dict:
    ran = [t for t in trials if duration(t) is not None and "duplicate_of" not in t.user_attrs
           and (since is None or t.datetime_start.timestamp() >= since)]
    total = sum(duration(t) for t in ran)
    out = {"trials run": len(ran), "sum of trial times (s)": round(total, 1)}
    if wall_s:
        out["sweep wall time (s)"] = round(wall_s, 1)
        out["speed-up over one after another"] = round(total / wall_s, 2) if wall_s > 0 else None
    return out


def stack_rows(trials, since: float | None = None) -> list[dict]:
    """Where a sweep's time went: one row per stack a worker trained (trials that share its worker, replicas,
    set-up seconds and pace, as a stack's trials all record them), in the order they started: seconds from the
    first start (or ``since``) to its start and end, the grid values its trials share (of those the sweep varies),
    its set-up, the step it ran compiled from, whether a helper had compiled it (precompile.py), and its training
    rate (its steps once ready over their seconds: set-up and evaluations left out)."""
    done = [t for t in trials if duration(t) is not None and "duplicate_of" not in t.user_attrs
            and t.user_attrs.get("result") and (since is None or t.datetime_start.timestamp() >= since)]
    if not done:
        return []
    groups: dict[tuple, list] = {}
    for t in done:
        res = t.user_attrs["result"]
        key = (t.user_attrs.get("worker"), res.get("replicas"), res.get("setup_s"), res.get("steps_per_sec"))
        groups.setdefault(key, []).append(t)
    values: dict[str, set] = {}
    for t in done:
        for k, v in t.user_attrs.get("grid", {}).items():
            values.setdefault(k, set()).add(json.dumps(v))
    varied = []            # the grid keys the sweep varies, less those zipped one-to-one with an earlier one
    for k in (k for k, vs in values.items() if len(vs) > 1):
        if not any(_one_to_one(done, j, k) for j in varied):
            varied.append(k)
    t0 = since if since is not None else min(t.datetime_start.timestamp() for t in done)
    rows = []
    for (worker, replicas, setup, sps), g in sorted(groups.items(), key=lambda kv: min(t.datetime_start for t in kv[1])):
        grid = g[0].user_attrs["grid"]
        shared = [f"{k.split('.', 1)[-1]}={'none' if grid[k] is None else _cell(grid[k])}" for k in varied
                  if len({json.dumps(t.user_attrs.get("grid", {}).get(k)) for t in g}) == 1]
        res = g[0].user_attrs["result"]
        rows.append({"worker": worker, "start s": round(min(t.datetime_start.timestamp() for t in g) - t0, 1),
                     "end s": round(max(t.datetime_complete.timestamp() for t in g) - t0, 1), "trials": len(g),
                     "stack of": " ".join(shared), "set-up s": setup, "compiled from step": res.get("compiled_at"),
                     "helper compiled": res.get("precompiled"), "steps/s": sps})
    return rows


def _one_to_one(trials, a: str, b: str) -> bool:
    """Whether grid keys ``a`` and ``b`` determine one another over ``trials`` (e.g. keys zipped in a sweep file)."""
    pairs = {(json.dumps(t.user_attrs["grid"].get(a)), json.dumps(t.user_attrs["grid"].get(b))) for t in trials}
    return len(pairs) == len({x for x, _ in pairs}) == len({y for _, y in pairs})


def gpu_table(samples: list[dict]) -> list[dict]:
    gpus = sorted({i for s in samples for i in s})
    rows = []
    for i in gpus:
        u = [s[i][0] for s in samples if i in s]
        m = [s[i][1] for s in samples if i in s]
        rows.append({"gpu": i, "mean util %": round(statistics.fmean(u), 1), "max util %": max(u),
                     "mean memory MiB": round(statistics.fmean(m)), "samples": len(u)})
    return rows


def write_outputs(sweep_dir: Path, study, trials, *, wall_s=None, since=None, gpu_samples=(), console=None):
    rows = trial_rows(trials)
    _write_csv(sweep_dir / "results.csv", rows, drop=("grid_id",))
    summary, grid_keys, _ = grid_summary(trials, study.direction.name.lower())
    _write_csv(sweep_dir / "summary.csv", summary)
    seeds = seed_summary(summary, grid_keys)
    failures = [{"trial": r["trial"], "point": point_label(t), "reason": r["note"]}
                for r, t in zip(rows, sorted(trials, key=lambda t: t.number)) if r["status"] in ("failed", "lost")]
    tm = timing(trials, wall_s, since)
    gpu = gpu_table(list(gpu_samples))
    md = [f"# Sweep {study.study_name}\n", progress_line(trials, study.direction.name.lower()) + "\n",
          "## Best per grid point\n", _md_table(summary)]
    if seeds:
        md += ["## Mean ± std over seeds (of the per-point best)\n", _md_table(seeds)]
    md += ["## Failures\n", _md_table(failures), "## Time (this invocation)\n", _md_table([tm]),
           "The speed-up is the sum of the trials' own wall times over the sweep's wall time. Trials "
           "that share a GPU each run slower than alone, so it overstates the gain over a sequential "
           "run; for that baseline, run the same sweep with `--workers 1` (see steps/s in results.csv).\n"]
    if gpu:
        md += ["## GPU utilisation (nvidia-smi samples during this invocation)\n", _md_table(gpu)]
    stacks = stack_rows(trials, since)
    if stacks:
        md += ["## Stacks (this invocation; seconds from its start)\n", _md_table(stacks)]
    (sweep_dir / "summary.md").write_text("\n".join(md))
    if console is not None:
        print_summary(console, study, trials, summary, seeds, failures, tm, gpu)
        console.print(f"results: {sweep_dir / 'results.csv'}  summary: {sweep_dir / 'summary.md'}  "
                      f"tensorboard --logdir {sweep_dir}")


def _rich_table(title: str, rows: list[dict]):
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    for c in rows[0]:
        t.add_column(str(c))
    for r in rows:
        t.add_row(*[str(_cell(r[c])) for c in rows[0]])
    return t


def print_summary(console, study, trials, summary, seeds, failures, tm, gpu) -> None:
    console.print(progress_line(trials, study.direction.name.lower()), highlight=False)
    if summary:
        console.print(_rich_table("best per grid point", summary))
    if seeds:
        console.print(_rich_table("mean ± std over seeds", seeds))
    if failures:
        console.print(_rich_table("failures", failures))
    if tm.get("trials run"):
        console.print(_rich_table("time", [tm]))
    if gpu:
        console.print(_rich_table("GPU utilisation", gpu))


def status(sweep_dir: Path, storage_url: str | None, storage_timeout: float = DEFAULT_TIMEOUT_S) -> int:
    from sandbox.sweep.study import load_study, open_storage

    meta_path = sweep_dir / "sweep.json"
    if not meta_path.is_file():
        raise ValueError(f"{sweep_dir}: not a sweep directory (no sweep.json)")
    meta = json.loads(meta_path.read_text())
    url = storage_url or meta["storage"]
    if url and "***" in url:
        raise ValueError(f"{sweep_dir}: the sweep uses {url}; pass --storage with the password")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(open_storage(sweep_dir, url, timeout=storage_timeout), meta["study"])
    trials = study.get_trials(deepcopy=False)
    console = make_console()
    summary, grid_keys, _ = grid_summary(trials, study.direction.name.lower())
    rows = trial_rows(trials)
    failures = [{"trial": r["trial"], "reason": r["note"]} for r in rows if r["status"] in ("failed", "lost")]
    print_summary(console, study, trials, summary, seed_summary(summary, grid_keys), failures, {}, [])
    stacks = stack_rows(trials)
    if stacks:
        console.print(_rich_table("stacks (seconds from the first one's start)", stacks))
    running = [t for t in trials if t.state == TrialState.RUNNING]
    if running:
        console.print(_rich_table("running", [{"trial": t.number, "point": point_label(t),
                                               "worker": t.user_attrs.get("worker", "?")} for t in running]))
    return 0


def print_points(spec) -> int:
    points = spec.points()
    rows = [{"#": i, **p.grid, **p.tune, "point id": p.point_id} for i, p in enumerate(points)]
    make_console().print(_rich_table(f"{spec.name}: {len(points)} trials", rows))
    return 0
