"""``sandbox inspect``: the SSE paper's pictures of a trained run, plus the numbers behind them.

Writes into ``RUN_DIR/inspect/`` (or ``out``): ``clustering.png`` (Fig. 2), ``similarity.png``
(Fig. 3), ``entropy.png`` (Fig. 5), ``receptive_field.png`` (Fig. 9), ``usage.png``, a one-page
``inspect.md`` and ``summary.json``; the same figures and numbers go to the run's TensorBoard
(tags ``inspect/...``). A picture whose tensors a mixer does not record is skipped with a note.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from sandbox.analysis import metrics
from sandbox.analysis.capture import capture, load_run

MAX_HEADS = 4           # heads drawn per layer in the grid pictures (numbers use all heads)
RF_THRESHOLD = 1e-3     # SSE Appendix C
RF_LAST = 128           # receptive field averaged over the last positions (SSE Appendix C)
# what one routing choice of a mixer is (the x axis of its usage picture); other mixers' read "choice"
CHOICES = {"sse": "partition", "mom": "memory", "sla": "head", "moba": "key block", "nsa": "key block"}


def _nanmean(t: torch.Tensor) -> float:
    return float(torch.nanmean(t.double())) if t.numel() else float("nan")


def _indexes_key_rows(routing: torch.Tensor, keys) -> bool:
    """True when integer routing picks rows of the keys: keys vanish off the chosen indices
    (row-sparse top-k). Then the number of options is the key width, not the largest index + 1."""
    if keys is None or routing.is_floating_point() or routing.dtype == torch.bool:
        return False
    if routing.shape[:-1] != keys.shape[:-1] or int(routing.max()) >= keys.shape[-1] or int(routing.min()) < 0:
        return False
    chosen = torch.zeros(keys.shape, dtype=torch.bool).scatter_(-1, routing.long(), True)
    return bool((keys.masked_fill(chosen, 0) == 0).all())


def analyse(per_layer: list[dict], layers: list[int], embed: str = "pca", max_points: int = 2000,
            seed: int = 0, mixers: list[str] | None = None) -> tuple[dict, dict, list[str]]:
    """Numbers per layer, figure panels, and notes on what was skipped. ``mixers``: each layer's mixer name,
    for the words on the usage picture."""
    numbers: dict[int, dict] = {}
    panels: dict[str, object] = {"clustering": {}, "similarity": {}, "entropy": {}, "receptive_field": {},
                                 "usage": []}
    notes: list[str] = []
    gen = torch.Generator().manual_seed(seed)
    rf_cap = None
    for l in layers:
        cap = per_layer[l]
        num = numbers[l] = {}
        keys, values, state, gates = (cap.get(k) for k in ("keys", "values", "final_state", "gates"))
        stateful = state is not None            # a key's entries are rows of a recurrent state, or just channels
        row_word = "state row" if stateful else "key channel"
        # state clustering (Fig. 2)
        if keys is not None and values is not None and keys.ndim == 4 and values.ndim == 4:
            r2s = []
            for h in range(keys.shape[2]):
                rows = metrics.key_rows(keys[:, :, h]).flatten()
                vals = values[:, :, h].reshape(-1, values.shape[-1])
                r2 = metrics.correlation_ratio(vals, rows)
                r2s.append(r2)
                if h < MAX_HEADS:
                    pick = torch.randperm(len(rows), generator=gen)[:max_points]
                    xy = metrics.tsne_2d(vals[pick], seed=seed) if embed == "tsne" else metrics.pca_2d(vals[pick])
                    panels["clustering"][(l, h)] = {"xy": xy, "colour": rows[pick], "choices": keys.shape[-1],
                                                    "r2": r2, "stateful": stateful}
            num["cluster_r2"] = _nanmean(torch.tensor(r2s))
        else:
            notes.append(f"layer {l}: no per-token keys/values recorded; clustering skipped")
        # row similarity (Fig. 3) and singular-value entropy (Fig. 5)
        if state is not None and state.ndim == 4:
            sim = metrics.row_cosine_similarity(state)               # [B, H, K, K]
            num["row_similarity"] = metrics.mean_offdiagonal(sim)
            num["row_similarity_signed"] = metrics.mean_offdiagonal(sim, absolute=False)
            num["dead_rows"] = float((state.double().norm(dim=-1) == 0).double().mean())
            for h in range(min(state.shape[1], MAX_HEADS)):
                panels["similarity"][(l, h)] = (sim[0, h], metrics.mean_offdiagonal(sim[:, h]))
            ent = metrics.singular_value_entropy(state)              # [B, H]
            per_head = torch.nanmean(ent, 0)
            panels["entropy"][l] = per_head
            panels["examples"] = state.shape[0]
            num["sv_entropy"] = _nanmean(per_head)
        else:
            notes.append(f"layer {l}: no final_state recorded (not a recurrent-state mixer?); "
                         "similarity and entropy skipped")
        # receptive field (Appendix C)
        if gates is not None and gates.ndim >= 3 and gates.is_floating_point() and bool((gates > 0).any()):
            notes.append(f"layer {l}: recorded gates are not log-decays (positive values); receptive field skipped")
        elif gates is not None and gates.ndim >= 3:
            rf = metrics.receptive_field(gates, RF_THRESHOLD)        # [B, T, C]
            last = min(RF_LAST, rf.shape[1])
            per_channel = rf[:, -last:].double().mean((0, 1))
            panels["receptive_field"][l] = per_channel
            panels["rf_last"], panels["seq_len"] = last, rf.shape[1]
            panels["rf_channel"] = "head" if gates.ndim == 3 else \
                "decay channel (state row" + ("; heads one after another)" if gates.shape[2] > 1 else ")")
            rf_cap = round((2 * rf.shape[1] - last - 1) / 2, 1)         # mean position t of those
            num["receptive_field"] = float(per_channel.mean())
            num["receptive_field_cap"] = rf_cap
            num["receptive_field_positions"] = last
        else:
            notes.append(f"layer {l}: no decay gates recorded; receptive field skipped")
        # usage of routing choices
        routing = {k: v for k, v in cap.items() if k.startswith("routing")}
        fallback = f"argmax key {row_word.split()[-1]} (no routing recorded)"
        if not routing and keys is not None and keys.ndim == 4:
            routing = {fallback: metrics.key_rows(keys)[..., None]}
        for name, r in routing.items():
            n, choice = None, CHOICES.get(mixers[l] if mixers else "", "choice")
            if name == fallback:
                choice = f"{row_word} of the largest key entry"
            elif _indexes_key_rows(r, keys):
                n, choice = keys.shape[-1], "state row"               # row choices of a head
            try:
                use, bal = metrics.usage(r, n)
            except ValueError as e:
                notes.append(f"layer {l}: {name}: usage skipped ({e})")
                continue
            summary = metrics.usage_summary(use)
            num.setdefault("usage", {})[name] = summary
            share = "mean weight" if r.is_floating_point() else "share of tokens"
            panels["usage"].append({"title": f"layer {l}: {name}  (max/balanced {summary['max_over_balanced']:.2f}, "
                                             f"usage entropy {summary['usage_entropy']:.3f})",
                                    "use": use, "balanced": bal, "choice": choice, "share": share})
    panels["rf_cap"] = rf_cap
    return numbers, panels, notes


def _figures(panels: dict, embed: str) -> dict:
    from sandbox.analysis import plots
    figs = {}
    if panels["clustering"]:
        figs["clustering"] = plots.clustering(panels["clustering"], "t-SNE" if embed == "tsne" else "PCA")
    if panels["similarity"]:
        figs["similarity"] = plots.similarity(panels["similarity"])
    if panels["entropy"]:
        figs["entropy"] = plots.entropy(panels["entropy"], panels["examples"])
    if panels["receptive_field"]:
        figs["receptive_field"] = plots.receptive_field(panels["receptive_field"], panels["rf_cap"], RF_THRESHOLD,
                                                        panels["rf_last"], panels["seq_len"], panels["rf_channel"])
    if panels["usage"]:
        figs["usage"] = plots.usage(panels["usage"])
    return figs


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def _explained(numbers: dict) -> str:
    """What the table's numbers mean, for the numbers the run has."""
    has = lambda key: any(key in n for n in numbers.values())  # noqa: E731
    parts = []
    if has("row_similarity"):
        parts += ["Row similarity: mean off-diagonal |cosine| between rows of the final state (SSE Fig. 3; lower "
                  "= more distinct rows). SV entropy: normalised singular-value entropy of the state, mean over "
                  "heads (SSE Fig. 5, footnote 8; higher = state used more evenly)."]
    if has("cluster_r2"):
        parts += ["Cluster R²: share of the value vectors' variance explained by the state row (for a mixer "
                  "without a state: the key channel) of the largest key entry (SSE Fig. 2)."]
    if has("receptive_field"):
        n = next(n for n in numbers.values() if "receptive_field" in n)
        over = (f"all {n['receptive_field_positions']} positions" if n["receptive_field_positions"] < RF_LAST
                else f"the last {RF_LAST} positions")
        parts += [f"Receptive field: steps back until the cumulative decay falls below {RF_THRESHOLD:g}, mean "
                  f"over channels and {over}, out of the largest possible (SSE Appendix C)."]
    return " ".join(parts)


def _markdown(run, numbers: dict, figs: dict, notes: list[str], batches: int, batch_size: int) -> str:
    cfg, res = run.cfg, run.result or {}
    mixers = cfg.model.layer_mixers()
    acc = res.get("final_accuracy")
    described = []
    for m in dict.fromkeys(mixers):                 # name plus the options that differ from its defaults
        opts = cfg.model.options(m)
        changed = {k: v for k, v in dataclasses.asdict(opts).items() if v != dataclasses.asdict(type(opts)())[k]} \
            if dataclasses.is_dataclass(opts) else {}
        described.append(m + (f" ({', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else ""))
    lines = [f"# inspect: {run.run_dir.name}", "",
             f"{' + '.join(described)}, d_model {cfg.model.d_model}, "
             f"{cfg.model.n_layers} layer{'s' if cfg.model.n_layers > 1 else ''}, "
             f"{cfg.model.n_heads} head{'s' if cfg.model.n_heads > 1 else ''}; task {cfg.task.name}; "
             f"checkpoint step {run.step}"
             + (f"; test accuracy {acc:.4f}" if acc is not None else "")
             + f". Measured on {batches} test batches of {batch_size}.", "",
             "| layer | mixer | row similarity (mean \\|cos\\|) | signed cos | SV entropy | cluster R² | "
             "receptive field (tokens) | usage max/balanced |",
             "|---|---|---|---|---|---|---|---|"]
    for l, n in numbers.items():
        use = n.get("usage") or {}
        bal = ", ".join(f"{u['max_over_balanced']:.2f}" for u in use.values()) or "-"
        rf = f"{n['receptive_field']:.1f} / {n['receptive_field_cap']}" if "receptive_field" in n else "-"
        lines.append(f"| {l} | {mixers[l]} | {_fmt(n.get('row_similarity'))} | {_fmt(n.get('row_similarity_signed'))}"
                     f" | {_fmt(n.get('sv_entropy'))} | {_fmt(n.get('cluster_r2'))} | {rf} | {bal} |")
    lines += ["", _explained(numbers), ""]
    for name, title in (("clustering", "Clustering by the key's largest entry"),
                        ("similarity", "Row-wise cosine similarity"),
                        ("entropy", "Singular-value entropy"), ("receptive_field", "Receptive field"),
                        ("usage", "Usage")):
        if name in figs:
            lines += [f"## {title}", "", f"![{name}]({name}.png)", ""]
    if notes:
        lines += ["## Skipped", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def inspect_run(run_dir, layer: int | None = None, batches: int = 4, batch_size: int = 64,
                tsne: bool = False, out=None, device: str = "auto", tensorboard: bool = True,
                log=print, pictures: bool = True) -> dict:
    """Capture, measure, draw (unless ``pictures`` is false: the numbers only), and write the report;
    returns the summary (also summary.json)."""
    import matplotlib.pyplot as plt

    run = load_run(run_dir, device)
    n_layers = len(run.model.mixers)
    if layer is not None and not 0 <= layer < n_layers:
        raise ValueError(f"layer: {layer} is out of range; the model has layers 0..{n_layers - 1}")
    layers = list(range(n_layers)) if layer is None else [layer]
    per_layer, _ = capture(run.model, run.task, batches, batch_size, layers)
    embed = "tsne" if tsne else "pca"
    numbers, panels, notes = analyse(per_layer, layers, embed=embed, max_points=600 if tsne else 2000,
                                     seed=run.cfg.seed, mixers=run.cfg.model.layer_mixers())
    out_dir = Path(out) if out is not None else run.run_dir / "inspect"
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = _figures(panels, embed) if pictures else {}
    from sandbox.analysis import plots
    for name, fig in figs.items():
        plots.save(fig, out_dir / f"{name}.png")
    md = _markdown(run, numbers, figs, notes, batches, batch_size)
    (out_dir / "inspect.md").write_text(md)
    summary = {"run_dir": str(run.run_dir), "step": run.step, "layers": {str(l): n for l, n in numbers.items()},
               "pictures": sorted(f"{n}.png" for n in figs), "notes": notes}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=str(run.run_dir))
        for name, fig in figs.items():
            writer.add_figure(f"inspect/{name}", fig, global_step=run.step, close=False)
        for l, n in numbers.items():
            for key in ("row_similarity", "sv_entropy", "cluster_r2", "receptive_field"):
                if key in n:
                    writer.add_scalar(f"inspect/layer{l}/{key}", n[key], run.step)
        writer.add_text("inspect/summary", md, run.step)
        writer.close()
    for fig in figs.values():
        plt.close(fig)
    for l, n in numbers.items():
        parts = [f"{k} {_fmt(n[k])}" for k in ("row_similarity", "sv_entropy", "cluster_r2", "receptive_field")
                 if k in n]
        for name, u in (n.get("usage") or {}).items():
            parts.append(f"usage[{name}] max/balanced {u['max_over_balanced']:.2f}")
        log(f"layer {l}: " + ("; ".join(parts) if parts else "nothing recorded"))
    for note in notes:
        log(f"note: {note}")
    log(f"wrote {out_dir / 'inspect.md'} ({len(figs)} pictures)" + ("; TensorBoard: inspect/*" if tensorboard else ""))
    return summary


def inspect_sweep(sweep_dir, device: str = "cpu", batches: int = 4, batch_size: int = 64, log=print,
                  figure=None) -> list[Path]:
    """A figure's state pictures from the checkpoints its sweep trained (the ``PICTURE_RUNS`` of the figure's
    ``verdict.py``, found as ``sandbox verdict`` finds it, or in the folder ``figure``): each
    variant's best learning rate per seed, inspected into SWEEP_DIR/state_pictures/<variant>-seed<s>/, with
    the pictures drawn for seed 0 and the numbers for every seed. Returns the folders written; a run whose
    cell has not finished is named and skipped. A run whose checkpoint is gone (sweep directories are copied
    without them, and a sweep spread over machines leaves each checkpoint where it trained) is trained again from the
    configuration its result.json recorded, same seed, into state_pictures/<variant>-seed<s>/run/ (the
    seeds of a variant as one stack), and its summary.json names the original run and both accuracies. Runs
    are named relative to SWEEP_DIR."""
    from sandbox.analysis.verdicts import picture_runs
    written, skipped, runs = [], [], []
    for variant, seed, run_dir in picture_runs(sweep_dir, figure):
        name = f"{variant}-seed{seed}"
        if run_dir is None or not (run_dir / "result.json").is_file():
            skipped.append(f"{name} (no finished trial)")
        else:
            runs.append((variant, seed, run_dir, Path(sweep_dir) / "state_pictures" / name))
    _retrain_missing(runs, device, log)
    for variant, seed, run_dir, out in runs:
        ckpt_dir = run_dir if (run_dir / "checkpoint.pt").is_file() else out / "run"
        log(f"{out.name}: {ckpt_dir}")
        inspect_run(ckpt_dir, batches=batches, batch_size=batch_size, out=out, device=device, tensorboard=False,
                    log=log, pictures=seed == 0)
        # the runs are named relative to the sweep directory, which is copied elsewhere (figures/NAME/)
        path = out / "summary.json"
        summary = json.loads(path.read_text())
        summary["run_dir"] = _within(ckpt_dir, sweep_dir)
        if ckpt_dir != run_dir:
            summary["retrained_from"] = {"run_dir": _within(run_dir, sweep_dir), "best_accuracy": _best(run_dir),
                                         "retrained_best_accuracy": _best(ckpt_dir)}
        path.write_text(json.dumps(summary, indent=1))
        written.append(out)
    if skipped:
        log(f"skipped {len(skipped)}: " + "; ".join(skipped))
    return written


def _within(path: Path, sweep_dir) -> str:
    """``path`` relative to the sweep directory (POSIX form)."""
    return Path(path).resolve().relative_to(Path(sweep_dir).resolve()).as_posix()


def _best(run_dir: Path):
    return json.loads((Path(run_dir) / "result.json").read_text()).get("best_accuracy")


def _retrain_missing(runs, device: str, log) -> None:
    """Train again, per variant as one stack, the picture runs whose checkpoint is gone."""
    from sandbox.config import load_config
    from sandbox.train import train_replicas
    by_variant: dict[str, list] = {}
    for variant, seed, run_dir, out in runs:
        if not (run_dir / "checkpoint.pt").is_file() and not (out / "run" / "checkpoint.pt").is_file():
            by_variant.setdefault(variant, []).append((run_dir, out / "run"))
    for variant, pairs in by_variant.items():
        cfgs = []
        for run_dir, _ in pairs:
            cfg = load_config(data=json.loads((run_dir / "result.json").read_text())["config"])
            cfgs.append(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device)))
        log(f"{variant}: no checkpoint for {len(pairs)} run(s); training them again from their recorded configuration")
        train_replicas(cfgs, [o for _, o in pairs], progress=False)
