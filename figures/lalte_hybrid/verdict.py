"""laLTE Table 2 (S-NIAH) as a synthetic analogue: recall at a distance G behind the pairs, G in units of laLTE's
window w. The criteria of README.md, fixed before the run: each effect is a difference of mean test accuracy over
seeds (the learning rate and step chosen per seed on val) with its 95% Welch interval, or, for the capped cache, the
mean of per-seed differences with its t interval.

The geometry is read from the sweep's base, so that a scaled-down copy of the sweep (the CPU test's) is judged by the
same code: w = ``model.lte.window``, p = ``task.num_kv_pairs``, the caps b = 2p and p/2, and G in {w/2, 2w, 4w, 8w}.
The capped-cache scores come from ``lte_eval.csv`` in the sweep directory (``score_twice.py``); until it is written,
the claims that need it read "not run".
"""
from __future__ import annotations

import csv
from pathlib import Path

from sandbox.analysis import stats
from sandbox.analysis.verdicts.claims import Cell, Claim, Control, Item, Table, greater, less, within

STAND_IN = "S-NIAH (RULER) in laLTE's Table 2: MQAR pairs a set distance G behind their queries, noise between"
SCORES = "lte_eval.csv"         # written by score_twice.py
MARGIN = 0.05                   # the smallest difference in recall worth reporting
WELL_ABOVE = 0.2                # "well above": laLTE over GDN+SWA beyond the window by at least this
BINDING = 0.1                   # the recall a binding cap must cost, at least
TOLERANCE = 0.02                # the capped cache against the training forward of the same checkpoint


def geometry(t: Table) -> tuple[int, int, dict[str, int]]:
    """(w, pairs, {label: G}) of the sweep: laLTE's window, the pairs and the four distances."""
    base = t.spec["base"]
    w, pairs = int(base["model"]["lte"]["window"]), int(base["task"]["num_kv_pairs"])
    return w, pairs, {"w/2": w // 2, "2w": 2 * w, "4w": 4 * w, "8w": 8 * w}


def rows(pairs: int) -> dict[str, dict]:
    """Each row's grid values (results.csv writes a layer pattern as its names joined by commas)."""
    lte = {"model.mixer": "gated_deltanet,lte", "model.lte.scorer": "cnn"}
    return {
        "GDN": {"model.mixer": "gated_deltanet"},
        "GDN+SWA": {"model.mixer": "gated_deltanet,swa"},
        "laLTE": {**lte, "model.lte.cap": 2 * pairs},
        f"laLTE, cap {pairs // 2}": {**lte, "model.lte.cap": pairs // 2},
        "LTE-MLP": {"model.mixer": "gated_deltanet,lte", "model.lte.scorer": "mlp"},
        "Pure LTE": {"model.mixer": "lte"},
        "laNSA": {"model.mixer": "gated_deltanet,nsa"},
        "GDN+MoBA": {"model.mixer": "gated_deltanet,moba"},
        "GDN+Attn.": {"model.mixer": "gated_deltanet,attention"},
    }


def lte_rows(pairs: int) -> list[str]:
    """The rows scored twice: every row with an lte layer."""
    return [label for label, where in rows(pairs).items() if "lte" in where["model.mixer"].split(",")]


def _cell(t: Table, row: str, g: int) -> Cell | None:
    _, pairs, _ = geometry(t)
    return t.cell(**rows(pairs)[row], **{"task.distance": g})


def _beyond(t: Table) -> dict[str, int]:
    return {k: g for k, g in geometry(t)[2].items() if k != "w/2"}


def capped_scores(t: Table) -> list[dict]:
    """The rows of ``lte_eval.csv`` in the sweep directories (none before score_twice.py has run) that scored the
    weights of the step the sweep chose on val, the step whose accuracy the other claims read."""
    out = []
    for d in dict.fromkeys(r["sweep_dir"] for r in t.rows) or [t.dir]:
        path = Path(d) / SCORES
        if path.is_file():
            with path.open(newline="") as f:
                out += [r for r in csv.DictReader(f) if at_chosen_step(r)]
    return out


def at_chosen_step(scored: dict) -> bool:
    """Whether a row of ``lte_eval.csv`` scored the weights of the step the sweep chose (rows scored from a final
    checkpoint that is not that step, or from before the file said which step, do not count)."""
    return scored.get("weights_step") not in (None, "") and scored.get("weights_step") == scored.get("chosen_step")


class Difference(Cell):
    """A cell of per-seed differences of two accuracies: its interval lies in [-1, 1], not [0, 1]."""

    def text(self) -> str:
        mark = "" if self.selected_on == "val" else "*"
        if self.n < 2:
            return f"{self.mean:+.3f}{mark}"
        _, lo, hi = stats.mean_ci(self.values, bounds=(-1.0, 1.0))
        return f"{self.mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"


def _scored(t: Table, row: str, g: int | None, value, kind=Cell) -> Cell | None:
    """A cell from ``lte_eval.csv``: per seed ``value(csv row)`` of the run chosen on val, at distance ``g``
    (None: every distance, the seeds of all of them together)."""
    got = [r for r in capped_scores(t) if r["row"] == row and (g is None or int(r["G"]) == g)]
    if not got:
        return None
    on = "val" if all(r.get("selected_on", "val") == "val" for r in got) else "test"
    return kind([value(r) for r in got], [int(r["seed"]) for r in got], on)


def _learned(cell: Cell | None, chance: float) -> bool:
    """Above chance by MARGIN with its whole interval: an equivalence of two rows that learned nothing would hold
    for no reason, so it is compared only where one of them learned."""
    return cell is not None and cell.n > 1 and stats.decide(stats.shift(cell.values, chance),
                                                              greater(MARGIN)) == stats.HOLDS


def control(t: Table) -> Control:
    return Control("GDN+Attn. (full attention) solves every distance",
                   {f"G = {k} ({g})": _cell(t, "GDN+Attn.", g) for k, g in geometry(t)[2].items()})


def swa_matches_lalte_inside(t: Table) -> Claim:
    claim = Claim("1: inside the window (G = w/2) GDN+SWA recalls as laLTE does", stand_in=STAND_IN)
    g = geometry(t)[2]["w/2"]
    lalte, swa = _cell(t, "laLTE", g), _cell(t, "GDN+SWA", g)
    reason = None
    if lalte is not None and swa is not None and not (_learned(lalte, t.chance) or _learned(swa, t.chance)):
        reason = f"neither is above chance ({t.chance:.3f}) by {MARGIN} with its whole interval"
    claim.compare(f"G = w/2 ({g})", lalte, swa, within(MARGIN), ("laLTE", "SWA"), reason)
    return claim


def swa_at_chance_beyond(t: Table) -> Claim:
    claim = Claim("2a: beyond the window (G = 2w, 4w, 8w) GDN+SWA is at chance (below twice the task's chance)",
                  stand_in=STAND_IN)
    for k, g in _beyond(t).items():
        claim.against(f"G = {k} ({g})", _cell(t, "GDN+SWA", g), t.chance, less(t.chance), "SWA")
    return claim


def lalte_above_swa_beyond(t: Table) -> Claim:
    claim = Claim(f"2b: beyond the window laLTE recalls well above GDN+SWA (by more than {WELL_ABOVE})",
                  stand_in=STAND_IN)
    for k, g in _beyond(t).items():
        claim.compare(f"G = {k} ({g})", _cell(t, "laLTE", g), _cell(t, "GDN+SWA", g), greater(WELL_ABOVE, 0.6),
                      ("laLTE", "SWA"))
    return claim


def lalte_near_attention(t: Table) -> Claim:
    claim = Claim(f"3: laLTE approaches full attention (GDN+Attn. - laLTE < {MARGIN} at every G)", stand_in=STAND_IN)
    for k, g in geometry(t)[2].items():
        claim.compare(f"G = {k} ({g})", _cell(t, "GDN+Attn.", g), _cell(t, "laLTE", g), less(MARGIN),
                      ("Attn.", "laLTE"))
    return claim


def binding_cap_costs_recall(t: Table) -> Claim:
    _, pairs, _ = geometry(t)
    binding = f"laLTE, cap {pairs // 2}"
    claim = Claim(f"4: a binding cap (b = p/2 = {pairs // 2}) lowers laLTE's recall through the capped cache beyond "
                  f"the window (by more than {BINDING})", stand_in=STAND_IN)
    for k, g in _beyond(t).items():
        full = _scored(t, "laLTE", g, _capped)
        reason = None                     # a cap cannot cost the recall a row does not have
        if full is not None and not _learned(full, t.chance):
            reason = f"cap {2 * pairs} is not above chance ({t.chance:.3f}) by {MARGIN} through the cache here"
        claim.compare(f"G = {k} ({g}), capped cache", full, _scored(t, binding, g, _capped), greater(BINDING, 0.4),
                      (f"cap {2 * pairs}", f"cap {pairs // 2}"), reason)
    return claim


def ablations_below_lalte(t: Table) -> Claim:
    claim = Claim(f"5: the ablations LTE-MLP and Pure LTE recall less than laLTE beyond the window (by more than "
                  f"{MARGIN})", stand_in=STAND_IN)
    for row in ("LTE-MLP", "Pure LTE"):
        for k, g in _beyond(t).items():
            claim.compare(f"{row}, G = {k} ({g})", _cell(t, "laLTE", g), _cell(t, row, g), greater(MARGIN, 0.3),
                          ("laLTE", row))
    return claim


def cache_matches_training_forward(t: Table) -> Claim:
    _, pairs, _ = geometry(t)
    claim = Claim(f"6: below its cap, the capped cache gives the training forward's accuracy (|capped - mask| < "
                  f"{TOLERANCE}, per row over its distances and seeds, on the same checkpoint)")
    for row in lte_rows(pairs):
        if row.startswith("laLTE, cap"):
            continue                      # the binding row: its difference is claim 4's subject, reported in the CSV
        diff = _scored(t, row, None, lambda r: _capped(r) - float(r["mask_accuracy"]), Difference)
        mask = _scored(t, row, None, lambda r: float(r["mask_accuracy"]))
        reason = None
        if mask is not None and not _learned(mask, t.chance):
            reason = f"its checkpoints are not above chance ({t.chance:.3f}) by {MARGIN} with the mask"
        claim.items.append(Item(row, diff, 0.0, within(TOLERANCE), ("capped - mask", "0"), reason))
    return claim


def _capped(r: dict) -> float:
    return float(r["capped_accuracy"])


CONTROL = control
CLAIMS = (swa_matches_lalte_inside, swa_at_chance_beyond, lalte_above_swa_beyond, lalte_near_attention,
          binding_cap_costs_recall, ablations_below_lalte, cache_matches_training_forward)
