"""What a sweep shows and writes: the live table, ``results.csv`` (one row per trial: its params, its
``RunResult`` summary and its bookkeeping), the per-grid-point summary (``summary.csv``, ``summary.md``) and
``sandbox sweep status``. Everything is computed from the Optuna study alone, so any machine sharing the storage
can report on the whole sweep. The summaries are group-bys over the trials' rows: by grid point (the best over
the tuned values), then by the grid point less its seed (mean and spread over seeds).
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
from sandbox.sweep.study import point_values, superseded
from sandbox.train.record import SUMMARY_FIELDS

# a row's status is the trial's (complete, pruned, ...): the run's own status and error are in its note
RESULT_COLUMNS = tuple(f for f in SUMMARY_FIELDS if f not in ("status", "error"))
STATUSES = ("complete", "pruned", "failed", "running", "waiting", "lost", "requeued", "duplicate", "superseded")


def make_console():
    """A rich console; wide when writing to a file or pipe so tables are not squeezed."""
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=200)


def group_by(rows: list[dict], keys) -> dict[tuple, list[dict]]:
    """Rows grouped by their values of ``keys``, in the order each group first appears."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(json.dumps(r.get(k), sort_keys=True, default=str) for k in keys), []).append(r)
    return groups


# ---- a trial's status and row -----------------------------------------------------------------

def retries_by_origin(trials) -> dict[int, object]:
    return {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}


def status_of(t, retried: dict | None = None, gone: dict | None = None) -> str:
    a = t.user_attrs
    if gone and t.number in gone:
        return "superseded"
    if t.state == TrialState.FAIL:
        if "duplicate_of" in a:
            return "duplicate"
        if retried and t.number in retried:     # lost, or failed and queued again (--retry-failed): its copy counts
            return "requeued"
        return "failed" if "failure" in a else "lost"
    return t.state.name.lower()


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
    """The grid keys and the tuned keys of the trials, in the sweep file's order."""
    grid, tune = {}, {}
    for t in trials:
        g, u = point_values(t)
        grid.update(dict.fromkeys(g))
        tune.update(dict.fromkeys(u))
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
    """One row per trial: number, status, point id, grid and tuned values, objective, result summary, time,
    worker, run directory, note, grid id."""
    grid_keys, tune_keys = keys_of(trials)
    retried, gone = retries_by_origin(trials), superseded(trials)
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        a, res = t.user_attrs, t.user_attrs.get("result") or {}
        grid, tune = point_values(t)
        status = status_of(t, retried, gone)
        d = duration(t)
        rows.append({"trial": t.number, "status": status, "point_id": a.get("point_id", ""),
                     **{k: grid.get(k) for k in grid_keys}, **{k: tune.get(k) for k in tune_keys},
                     "sample": a.get("sample"), "objective": t.value if status == "complete" else None,
                     **{k: res.get(k) for k in RESULT_COLUMNS},
                     "trial_time_s": round(d, 2) if d is not None else None, "worker": a.get("worker", ""),
                     "run_dir": a.get("run_dir", ""), "note": _note(t, retried, gone), "grid_id": a.get("grid_id", "")})
    return rows


# ---- summaries: group-bys over the rows -------------------------------------------------------

def grid_summary(trials, direction: str) -> tuple[list[dict], list[str], list[str]]:
    """One row per grid point: the best objective over its tuned trials."""
    grid_keys, tune_keys = keys_of(trials)
    sign = 1 if direction == "maximize" else -1
    out = []
    for rows in group_by([r for r in trial_rows(trials) if r["grid_id"]], ["grid_id"]).values():
        done = [r for r in rows if r["objective"] is not None]
        best = max(done, key=lambda r: sign * r["objective"]) if done else {}
        counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
        out.append({**{k: rows[0][k] for k in grid_keys}, "best": best.get("objective"),
                    **{f"best {k}": best.get(k) for k in tune_keys}, "trial": best.get("trial"),
                    "steps": best.get("steps"), "steps_per_sec": best.get("steps_per_sec"),
                    "params": rows[0]["params"] or best.get("params"),
                    "state_size": rows[0]["state_size"] or best.get("state_size"),
                    "trials": " ".join(f"{n} {s}" for s, n in counts.items() if n)})
    return out, grid_keys, tune_keys


def seed_summary(summary: list[dict], grid_keys: list[str]) -> list[dict]:
    """Mean ± std of the per-point best over the `seed` axis."""
    if "seed" not in grid_keys:
        return []
    rest = [k for k in grid_keys if k != "seed"]
    out = []
    for rows in group_by(summary, rest).values():
        vals = [r["best"] for r in rows if r["best"] is not None]
        out.append({**{k: rows[0][k] for k in rest}, "mean": statistics.fmean(vals) if vals else None,
                    "std": statistics.stdev(vals) if len(vals) > 1 else 0.0 if vals else None,
                    "seeds": f"{len(vals)}/{len(rows)}"})
    return out


def counts(trials) -> dict:
    retried, gone = retries_by_origin(trials), superseded(trials)
    c = dict.fromkeys(STATUSES, 0)
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
    grid, tune = point_values(t)
    return " ".join(f"{k}={_cell(v)}" for k, v in {**grid, **tune}.items()) or "(base)"


# ---- progress and time -------------------------------------------------------------------------

def progress_line(trials, direction: str, since: float | None = None, now: float | None = None) -> str:
    c = counts(trials)
    total = c["complete"] + c["pruned"] + c["failed"] + c["running"] + c["waiting"] + c["lost"]
    parts = [f"{c['complete'] + c['pruned'] + c['failed']}/{total} trials finished ({c['complete']} complete, "
             f"{c['pruned']} pruned, {c['failed']} failed), {c['running']} running, {c['waiting']} waiting"
             + (f", {c['superseded']} superseded (trained again by --retrain)" if c["superseded"] else "")]
    b = best_trial(trials, direction)
    if b is not None:
        parts.append(f"best {b.value:.4f} (trial {b.number}: {point_label(b)})")
    left = eta(trials, since, now)
    if left is not None:
        parts.append(f"about {_hms(left)} left")
    return "; ".join(parts)


def eta(trials, since: float | None = None, now: float | None = None) -> float | None:
    """Seconds until the queue is done, at the pace of this invocation: each waiting trial takes as long as the
    mean finished one; each running trial has left what its own progress says (its elapsed time over the steps
    of its last evaluation, of its ``steps``), or, before its first evaluation, what the finished trials that
    ran longer than it had left after as long (half its elapsed time if none did). The trials running now run
    at once (a worker's stack trains them together), so that much work is done that many at a time. None
    before a trial finished or while none runs."""
    now = time.time() if now is None else now
    finished = [duration(t) for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                and duration(t) is not None and "duplicate_of" not in t.user_attrs
                and (since is None or t.datetime_start.timestamp() >= since)]
    running = [t for t in trials if t.state == TrialState.RUNNING and t.datetime_start is not None]
    if not finished or not running:
        return None
    waiting = sum(t.state == TrialState.WAITING for t in trials)

    def left(t) -> float:
        elapsed = max(0.0, now - t.datetime_start.timestamp())
        steps, at = t.user_attrs.get("steps"), t.last_step
        if steps and at:
            return elapsed * max(0, steps - at) / at
        longer = [d - elapsed for d in finished if d > elapsed]
        return statistics.fmean(longer) if longer else 0.5 * elapsed
    return (waiting * statistics.fmean(finished) + sum(left(t) for t in running)) / len(running)


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _stacks(trials) -> dict[tuple, list]:
    """The trials that trained together, by stack: the ``stack`` attribute a worker sets (the first trial of its
    group); for studies written before it, the group's worker, replicas, set-up and pace, which its trials
    record alike."""
    def key(t):
        res = t.user_attrs.get("result") or {}
        if "stack" in t.user_attrs:
            return t.user_attrs.get("worker"), t.user_attrs["stack"]
        return t.user_attrs.get("worker"), res.get("replicas"), res.get("setup_s"), res.get("steps_per_sec")
    groups: dict[tuple, list] = {}
    for t in trials:
        groups.setdefault(key(t), []).append(t)
    return groups


def _ran(trials, since: float | None) -> list:
    return [t for t in trials if duration(t) is not None and "duplicate_of" not in t.user_attrs
            and (since is None or t.datetime_start.timestamp() >= since)]


def _span(group) -> tuple[float, float]:
    return (min(t.datetime_start.timestamp() for t in group), max(t.datetime_complete.timestamp() for t in group))


def timing(trials, wall_s: float | None, since: float | None) -> dict:
    """Trials and stacks run, and how many stacks trained at once on average: the stacks' own wall times (each
    counted once, however many trials it trained) over the sweep's. At most the number of workers."""
    ran = _ran(trials, since)
    stacks = _stacks(ran).values()
    busy = sum(end - start for start, end in map(_span, stacks))
    out = {"trials run": len(ran), "stacks run": len(stacks), "sum of stack times (s)": round(busy, 1)}
    if wall_s:
        out["sweep wall time (s)"] = round(wall_s, 1)
        out["stacks training at once (mean)"] = round(busy / wall_s, 2)
    return out


TIMING_NOTE = ("Stacks training at once: the stacks' own wall times, each counted once whatever the number of "
               "trials it trained together, over the sweep's wall time; at most the number of workers. What "
               "stacking itself saves (a stack of N trials against N runs one after another) takes a run with "
               "`--stack 1` to measure (see steps/s in results.csv).\n")


def stack_rows(trials, since: float | None = None) -> list[dict]:
    """Where a sweep's time went: one row per stack a worker trained, in the order they started: seconds from the
    first start (or ``since``) to its start and end, the grid values its trials share (of those the sweep varies),
    its set-up, the step it ran compiled from, what torch's compile caches gave it, and its training
    rate (its steps once ready over their seconds: set-up and evaluations left out)."""
    done = [t for t in _ran(trials, since) if t.user_attrs.get("result")]
    if not done:
        return []
    grids = {t.number: point_values(t)[0] for t in done}
    values: dict[str, set] = {}
    for g in grids.values():
        for k, v in g.items():
            values.setdefault(k, set()).add(json.dumps(v))
    varied = []            # the grid keys the sweep varies, less those zipped one-to-one with an earlier one
    for k in (k for k, vs in values.items() if len(vs) > 1):
        if not any(_one_to_one(grids.values(), j, k) for j in varied):
            varied.append(k)
    t0 = since if since is not None else min(t.datetime_start.timestamp() for t in done)
    rows = []
    for g in sorted(_stacks(done).values(), key=lambda g: _span(g)[0]):
        grid, res = grids[g[0].number], g[0].user_attrs["result"]
        shared = [f"{k.split('.', 1)[-1]}={'none' if grid[k] is None else _cell(grid[k])}" for k in varied
                  if len({json.dumps(grids[t.number].get(k)) for t in g}) == 1]
        start, end = _span(g)
        rows.append({"worker": g[0].user_attrs.get("worker"), "start s": round(start - t0, 1),
                     "end s": round(end - t0, 1), "trials": len(g), "stack of": " ".join(shared),
                     "set-up s": res.get("setup_s"), "compiled from step": res.get("compiled_at"),
                     "compile cache": res.get("compile_cache"), "steps/s": res.get("steps_per_sec")})
    return rows


def _one_to_one(grids, a: str, b: str) -> bool:
    """Whether grid keys ``a`` and ``b`` determine one another over ``grids`` (e.g. keys zipped in a sweep file)."""
    pairs = {(json.dumps(g.get(a)), json.dumps(g.get(b))) for g in grids}
    return len(pairs) == len({x for x, _ in pairs}) == len({y for _, y in pairs})


def gpu_table(samples: list[dict]) -> list[dict]:
    rows = []
    for i in sorted({i for s in samples for i in s}):
        u = [s[i][0] for s in samples if i in s]
        m = [s[i][1] for s in samples if i in s]
        rows.append({"gpu": i, "mean util %": round(statistics.fmean(u), 1), "max util %": max(u),
                     "mean memory MiB": round(statistics.fmean(m)), "samples": len(u)})
    return rows


def running_rows(trials, now: float | None = None) -> list[dict]:
    """The running trials: what each runs, where, for how long, and its last evaluation."""
    now = time.time() if now is None else now
    rows = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        steps, at = t.user_attrs.get("steps"), t.last_step
        rows.append({"trial": t.number, "point": point_label(t), "worker": t.user_attrs.get("worker", "?"),
                     "running for": _hms(now - t.datetime_start.timestamp()) if t.datetime_start else "",
                     "step": "" if at is None else f"{at}/{steps}" if steps else str(at),
                     "last evaluation": "" if at is None else f"{t.intermediate_values[at]:.4f}"})
    return rows


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
        line = progress_line(trials, self.direction, self.t0)
        if self.live is None:
            if line != self.last_line and (time.time() - self.last_print >= 10 or counts(trials)["running"] == 0):
                self.console.print(f"{time.strftime('%H:%M:%S')} {line}" + (f"  [{gpu}]" if gpu else ""),
                                   highlight=False)
                self.last_line, self.last_print = line, time.time()
            return
        from rich.console import Group
        rows = running_rows(trials)
        head = f"[bold]{self.name}[/]  {_hms(time.time() - self.t0)} elapsed  {line}" + (f"\nGPU: {gpu}" if gpu else "")
        table = _rich_table(f"running ({workers} workers)", rows) if rows else ""
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


def _failures(trials, rows) -> list[dict]:
    by_number = {t.number: t for t in trials}
    return [{"trial": r["trial"], "point": point_label(by_number[r["trial"]]), "reason": r["note"]}
            for r in rows if r["status"] in ("failed", "lost")]


def write_outputs(sweep_dir: Path, study, trials, *, wall_s=None, since=None, gpu_samples=(), console=None):
    direction = study.direction.name.lower()
    rows = trial_rows(trials)
    _write_csv(sweep_dir / "results.csv", rows, drop=("grid_id",))
    summary, grid_keys, _ = grid_summary(trials, direction)
    _write_csv(sweep_dir / "summary.csv", summary)
    seeds = seed_summary(summary, grid_keys)
    failures = _failures(trials, rows)
    tm = timing(trials, wall_s, since)
    gpu = gpu_table(list(gpu_samples))
    md = [f"# Sweep {study.study_name}\n", progress_line(trials, direction) + "\n",
          "## Best per grid point\n", _md_table(summary)]
    if seeds:
        md += ["## Mean ± std over seeds (of the per-point best)\n", _md_table(seeds)]
    md += ["## Failures\n", _md_table(failures), "## Time (this invocation)\n", _md_table([tm]), TIMING_NOTE]
    if gpu:
        md += ["## GPU utilisation (nvidia-smi samples during this invocation)\n", _md_table(gpu)]
    stacks = stack_rows(trials, since)
    if stacks:
        md += ["## Stacks (this invocation; seconds from its start)\n", _md_table(stacks)]
    (sweep_dir / "summary.md").write_text("\n".join(md))
    if console is not None:
        print_summary(console, study, trials, summary, seeds, failures, tm, gpu)
        console.print(f"results: {sweep_dir / 'results.csv'}  summary: {sweep_dir / 'summary.md'}  "
                      f"tensorboard --logdir {sweep_dir}", highlight=False)


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
    for title, rows in (("best per grid point", summary), ("mean ± std over seeds", seeds), ("failures", failures),
                        ("time", [tm] if tm.get("trials run") else []), ("GPU utilisation", gpu)):
        if rows:
            console.print(_rich_table(title, rows))


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
    print_summary(console, study, trials, summary, seed_summary(summary, grid_keys),
                  _failures(trials, trial_rows(trials)), {}, [])
    stacks = stack_rows(trials)
    if stacks:
        console.print(_rich_table("stacks (seconds from the first one's start)", stacks))
    running = running_rows(trials)
    if running:
        console.print(_rich_table("running (step: of its last evaluation)", running))
    return 0


def print_points(spec) -> int:
    points = spec.points()
    rows = [{"#": i, **p.grid, **p.tune, "trial id": p.point_id} for i, p in enumerate(points)]
    make_console().print(_rich_table(f"{spec.name}: {len(points)} trials over {spec.grid_points} grid points", rows))
    return 0
