"""SSE Figures 3, 5 and 9: what the states learned, from the state pictures' summaries."""
from __future__ import annotations

import json
import math
from pathlib import Path

from sandbox.analysis.verdicts.claims import Cell, Claim, Table, judge


# From checkpoints a figure's sweep already trains: per variant and seed, the run of the best learning rate,
# inspected by ``sandbox inspect SWEEP_DIR`` into SWEEP_DIR/state_pictures/<variant>-seed<s>/.

PICTURE_RUNS = {"sse_state_scaling": (
    ("gla", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.conv_size": 0, "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1})),
    "sse_state_scaling_conv": (          # every row there has conv 4
    ("gla", {"model.mixer": "gla", "model.gla.topk": None}),
    ("gla-topk", {"model.mixer": "gla", "model.gla.topk": 8}),
    ("sse-n4k1", {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1}))}
PICTURE_SEEDS = 3
# (summary key, the direction the SSE paper predicts for sparse states against dense GLA, label)
STATE_METRICS = (("row_similarity", -1, "lower row similarity (Fig. 3)"),
                 ("sv_entropy", +1, "higher singular-value entropy (Fig. 5)"),
                 ("receptive_field", +1, "larger receptive field (Fig. 9)"))
STATE_MIN_EFFECT = 0.05        # a difference must also reach 5% of dense GLA's mean


def picture_runs(sweep_dir) -> list[tuple[str, int, Path | None]]:
    """(variant, seed, run directory or None while that cell has no finished trial) of a figure's state pictures."""
    t = Table(Path(sweep_dir))
    if t.name not in PICTURE_RUNS:
        raise ValueError(f"sweep_dir: {sweep_dir} holds sweep {t.name!r}, which has no state pictures "
                         f"(known: {', '.join(sorted(PICTURE_RUNS))})")
    out = []
    for variant, where in PICTURE_RUNS[t.name]:
        best = t.best_rows(**where)
        for seed in range(PICTURE_SEEDS):
            row = best.get(seed)
            out.append((variant, seed, row["sweep_dir"] / row["run_dir"] if row and row.get("run_dir") else None))
    return out


def _state_cell(t: Table, variant: str, key: str) -> Cell | None:
    """A variant's metric over its seeds: per run, the mean over the layers that have it."""
    values = []
    for seed in range(PICTURE_SEEDS):
        path = t.dir / "state_pictures" / f"{variant}-seed{seed}" / "summary.json"
        if not path.is_file():
            return None
        layers = json.loads(path.read_text())["layers"].values()
        got = [float(n[key]) for n in layers if n.get(key) is not None and math.isfinite(float(n[key]))]
        if not got:
            return None
        values.append(sum(got) / len(got))
    return Cell(values)


def state_claim(t: Table, metric: tuple[str, int, str]) -> Claim:
    key, sign, label = metric
    claim = Claim(f"states: sparse states have {label} than dense GLA ({PICTURE_SEEDS} seeds)")
    variants = [v for v, _ in PICTURE_RUNS[t.name]]
    dense = _state_cell(t, variants[0], key)
    for sparse_name in variants[1:]:
        sparse = _state_cell(t, sparse_name, key)
        if dense is None or sparse is None:
            claim.missing(f"{sparse_name} vs {variants[0]}")
            continue
        d = sign * (sparse.mean - dense.mean)
        big = max(2 * max(sparse.sd, dense.sd), STATE_MIN_EFFECT * abs(dense.mean))
        outcome = "as predicted" if d > big else "reversed" if -d > big else "neither"
        claim.add(f"{sparse_name} vs {variants[0]}", f"{sparse.text()} vs {dense.text()}", outcome)

    def rule(o):
        return judge(all(x == "as predicted" for x in o), any(x == "reversed" for x in o))
    claim.decide(("as predicted", "reversed", "neither"), rule)
    return claim
