"""`sandbox verdict`: each figure's claims (figures/NAME/verdict.py) judged on synthetic sweeps whose truth is built
in (a true effect must make a claim hold, a null must make it fail, and a clear effect between cells of bimodal seeds
that the rule before issue 74 could not decide must be decided), the committed runs' verdicts as their READMEs print
them, how a cell picks a seed's trial, and how a sweep directory finds its figure's code."""
import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from sandbox.analysis.verdicts import Table, judge, report, verdicts

FIGURES = Path(__file__).resolve().parent.parent / "figures"
FOLDER = {"sse_fig8_topk": "sse_fig8_topk", "sse_state_scaling": "sse_state_scaling",
          "sse_state_scaling_conv": "sse_state_scaling", "sse_ablations": "sse_ablations", "sla_heads": "sla_heads",
          "zoology_fig2": "zoology_fig2"}
PAIRS = {"sse_fig8_topk": 16, "sse_state_scaling": 32, "sse_state_scaling_conv": 32, "sse_ablations": 32,
         "sla_heads": 16, "zoology_fig2": 4}


# ---- synthetic sweeps ---------------------------------------------------------------------------------------------

def write_rows(d: Path, name: str, cells, val: bool = False) -> Path:
    """As `sandbox sweep figures/FOLDER/NAME.yaml` leaves its directory. cells: [(grid values, [accuracy per seed])];
    per seed, the trial of the learning rate that reached the value, a worse one and a failed one (at 1.0, which must
    not count). With ``val``, each trial also records its validation accuracy (the worse rate's test accuracy is then
    higher, and must not count either: the choice is made on val)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "sweep.yaml").write_text(yaml.safe_dump({"name": name, "base": {"task": {"name": "mqar",
                                                                                   "num_kv_pairs": PAIRS[name]}}}))
    (d / "sweep.json").write_text(json.dumps({"study": name, "source": str(FIGURES / FOLDER[name] / f"{name}.yaml")}))
    cols = sorted(set().union(*(g.keys() for g, _ in cells))) if cells else []
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "status", "seed", *cols, "train.lr", "best_accuracy"]
                   + (["best_val_accuracy", "test_at_best_val"] if val else []))
        n = 0
        for grid, accs in cells:
            values = ["" if grid.get(c) is None else grid[c] for c in cols]
            for seed, acc in enumerate(accs):
                worse = min(1.0, acc + 0.3) if val else acc / 3
                for lr, status, test, v in ((2e-3, "complete", acc, 0.9), (8e-3, "complete", worse, 0.5),
                                            (5e-4, "failed", 1.0, 1.0)):
                    w.writerow([n, status, seed, *values, lr, test] + ([v, test] if val else []))
                    n += 1
    return d


def tight(m: float, n: int = 5) -> list[float]:
    """n seeds that agree: m +- 0.01."""
    return [m - 0.01 + 0.02 * i / (n - 1) for i in range(n)]


def bimodal(learned: int, n: int = 30) -> list[float]:
    """n seeds at the edge of learning: ``learned`` of them near 0.98, the others near 0.02."""
    return [(0.98 if i < learned else 0.02) + 0.0001 * i for i in range(n)]


def old_rule_decides(a, b) -> bool:
    """The rule before issue 74 (``beats``, either way): a difference of at least 0.03 and above twice the larger sd."""
    d = statistics.mean(a) - statistics.mean(b)
    return abs(d) >= 0.03 and abs(d) > 2 * max(statistics.stdev(a), statistics.stdev(b))


def outcomes(claim) -> list[str]:
    return claim.judged()[1]


# ---- cells: a seed's trial chosen on val, read on test; pooled reruns -----------------------------------------------

def sla(mixer, heads, conv=4):
    return {"model.mixer": mixer, "model.gla.conv_size": conv, "model.sla.conv_size": conv, "model.n_heads": heads}


def test_a_cell_picks_each_seeds_trial_on_val_and_reads_its_test_accuracy(tmp_path):
    cells = [(sla("gla", 4), [0.2, 0.4])]
    on_val = Table(write_rows(tmp_path / "val", "sla_heads", cells, val=True)).cell(**sla("gla", 4))
    assert on_val.values == [0.2, 0.4] and on_val.seeds == [0, 1] and on_val.selected_on == "val"
    assert not on_val.text().endswith("*")
    on_test = Table(write_rows(tmp_path / "test", "sla_heads", cells)).cell(**sla("gla", 4))
    assert on_test.values == [0.2, 0.4] and on_test.selected_on == "test" and on_test.text().endswith("*")


def test_reruns_of_one_protocol_pool_as_more_seeds_and_other_sweeps_are_refused(tmp_path):
    first = write_rows(tmp_path / "a", "sla_heads", [(sla("gla", 4), [0.1, 0.2])])
    again = write_rows(tmp_path / "b", "sla_heads", [(sla("gla", 4), [0.9, 0.9, 0.3])])    # seeds 0-2
    cell = Table(first, again).cell(**sla("gla", 4))
    assert cell.seeds == [0, 1, 2] and cell.values == [0.1, 0.2, 0.3]     # a seed in both: the first directory's
    other = write_rows(tmp_path / "c", "sse_ablations", [])
    with pytest.raises(ValueError, match="hold different sweeps"):
        Table(first, other)


def test_an_undecided_comparison_says_what_its_deciding_seeds_cost(tmp_path):
    """Each trial's GPU share is its wall time over the replicas stacked with it: a seed whose 2 finished trials
    took 120 s in stacks of 4 costs 60 GPU-seconds, and the seeds that would decide a comparison cost that for
    each seed a cell lacks; a plan, for all its seeds in every cell. A run with no recorded times prints no cost."""
    from sandbox.analysis import stats
    from sandbox.analysis.verdicts.claims import Claim, greater
    d = write_rows(tmp_path / "timed", "sla_heads", [(sla("gla", 4), bimodal(2, 4)), (sla("sla", 4), bimodal(1, 4))])
    rows = list(csv.DictReader(open(d / "results.csv")))
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, [*rows[0], "wall_time_s", "replicas"])
        w.writeheader()
        w.writerows({**r, "wall_time_s": 120.0, "replicas": 4} for r in rows)
    t = Table(d)
    a, b = t.cell(**sla("gla", 4)), t.cell(**sla("sla", 4))
    assert a.gpu_s_per_seed == pytest.approx(60.0) and b.gpu_s_per_seed == pytest.approx(60.0)
    claim = Claim("gain")
    claim.compare("gla over sla", a, b, greater(0.05, 0.3))
    assert claim.verdict() == "inconclusive"
    k = stats.seeds_to_decide(claim.items[0].effect, claim.items[0].rule)
    assert k > 4 and f"about {2 * (k - 4) * 60 / 60:.0f} GPU-minutes more" in claim.markdown()
    planned = stats.seeds_for_power(claim.items[0].sds(), claim.items[0].rule, 0.8, 1)
    assert f"| {planned} | {planned * 2 * 60 / 60:.0f} |" in claim.plan_markdown()      # a whole run of them
    untimed = Table(write_rows(tmp_path / "untimed", "sla_heads", [(sla("gla", 4), bimodal(2, 4))]))
    assert untimed.cell(**sla("gla", 4)).gpu_s_per_seed is None


# ---- how a sweep directory finds its figure -------------------------------------------------------------------------

def fig8(topk, dense, d=128):
    """Every Figure 8 pair at one width: top-k and dense cells of each mixer and setting."""
    out = []
    for mixer in ("gla", "metala", "gsa"):
        for gap, noise in ((192, 0), (0, 192)):
            for k, accs in ((16, topk), (None, dense)):
                out.append(({"model.mixer": mixer, "model.d_model": d, "model.gsa.topk": k, "model.gla.conv_size": 4,
                             "task.gap": gap, "task.noise": noise}, accs))
    return out


def test_a_sweep_without_criteria_is_a_clear_error(tmp_path):
    d = write_rows(tmp_path, "sse_fig8_topk", [])
    other = {"name": "other", "base": {"task": {"name": "mqar", "num_kv_pairs": 8}}}
    (d / "sweep.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(ValueError, match="holds sweep 'other', but the sweep files of .*sse_fig8_topk name "
                                         "sse_fig8_topk$"):
        verdicts(d)
    (d / "sweep.json").unlink()
    with pytest.raises(ValueError, match="has no figure code.*pass --figure figures/NAME"):
        verdicts(d)


def test_a_sweep_directory_finds_its_figure_beside_its_sweep_file_in_itself_or_by_flag(tmp_path):
    cells = fig8(tight(0.9), tight(0.3))
    by_source = verdicts(write_rows(tmp_path / "a", "sse_fig8_topk", cells))
    (tmp_path / "a" / "sweep.json").unlink()
    by_flag = verdicts(tmp_path / "a", figure=FIGURES / "sse_fig8_topk")
    inside = write_rows(tmp_path / "fig" / "run", "sse_fig8_topk", cells)   # a figure folder, its run one down
    (inside / "sweep.json").unlink()
    (tmp_path / "fig" / "verdict.py").write_text((FIGURES / "sse_fig8_topk" / "verdict.py").read_text())
    (tmp_path / "fig" / "part1.yaml").write_text("name: sse_fig8_topk\n")
    by_folder = verdicts(inside)
    assert [c.items for c in by_flag] == [c.items for c in by_source] == [c.items for c in by_folder]
    assert by_source[0].verdict() == "holds"


# ---- the committed runs: the verdicts each README prints ----------------------------------------------------------

COMMITTED = {
    "sse_state_scaling/conv": ["inconclusive"] * 6,
    "sse_state_scaling/no_conv": ["does not hold", "does not hold"] + ["inconclusive"] * 4,
    "sse_ablations/pilot": ["inconclusive"] * 3,
}


def cells_of(item) -> list:
    return [c for c in ([item.a, item.b] if hasattr(item, "a") else [c for _, c in item.terms]) if hasattr(c, "n")]


@pytest.mark.parametrize("run", sorted(COMMITTED))
def test_the_committed_runs_give_the_verdicts_their_readme_prints(run):
    control, claims = judge(FIGURES / run)
    assert [c.verdict() for c in claims] == COMMITTED[run]
    assert not control.passes() and all(c is None for c in control.cells.values())   # the rerun adds it
    assert {c.selected_on for claim in claims for i in claim.items for c in cells_of(i)} == {"test"}


def test_the_ablations_rerun_so_far_decides_nothing_and_says_what_has_not_run():
    """run/ (the paper's gate, 24 of 560 trials): seeds 0-2 of the default and SiLU rows, rates and steps chosen on
    val. Claim 1 compares 3 seeds a side; the control's row and the other variants have not run, and say so."""
    control, claims = judge(FIGURES / "sse_ablations/run")
    assert not control.passes() and all(c is None for c in control.cells.values())
    assert [c.verdict() for c in claims] == ["inconclusive"] * 3
    assert "inconclusive: 1 of 1 item not run yet" in claims[1].markdown()
    assert "inconclusive: 3 of 3 items not run yet" in claims[2].markdown()
    keys = claims[0].items[0]
    assert (keys.a.n, keys.b.n) == (3, 3) and {keys.a.selected_on, keys.b.selected_on} == {"val"}
    assert not keys.same_seed_by_seed()
    assert all(i.b is None for claim in claims[1:] for i in claim.items)


def test_the_sla_rerun_so_far_passes_its_control_and_has_not_run_the_gain():
    """run/ (60 of 180 trials): the control's 3 seeds at each head count, chosen on val, every one above 0.99;
    GLA's seeds 0-2 at 4 and 8 heads; no SLA cell, so the claim's one item has not run and says so."""
    control, (claim,) = judge(FIGURES / "sla_heads/run")
    assert control.passes()
    assert [(c.n, c.selected_on) for c in control.cells.values()] == [(3, "val")] * 3
    assert all(min(c.values) >= 0.99 for c in control.cells.values())
    assert claim.verdict() == "inconclusive" and "inconclusive: 1 of 1 item not run yet" in claim.markdown()


def test_only_cells_equal_seed_by_seed_below_solved_are_flagged_as_one_model():
    from sandbox.analysis.verdicts.claims import Cell, Item, Rule
    rule = Rule("greater", 0.05)
    item = lambda a, b, seeds=(0, 1, 2): Item("x", Cell(a, list(seeds)), Cell(b, list(seeds)), rule)  # noqa: E731
    assert item([0.41, 0.97, 0.55], [0.41, 0.97, 0.55]).same_seed_by_seed()
    assert not item([0.41, 0.97, 0.55], [0.41, 0.97, 0.56]).same_seed_by_seed()
    assert not item([0.41, 0.97, 0.55], [0.97, 0.41, 0.55]).same_seed_by_seed()      # same values, other seeds
    assert not item([1.0, 0.995, 1.0], [1.0, 0.995, 1.0]).same_seed_by_seed()         # solved twice: no sign
    assert not item([0.41], [0.41], seeds=(0,)).same_seed_by_seed()


@pytest.mark.parametrize("figure", ["sse_state_scaling", "sse_ablations", "sla_heads"])
def test_each_readme_shows_what_sandbox_verdict_prints_and_the_seeds_the_rerun_needs(figure):
    readme = (FIGURES / figure / "README.md").read_text()
    assert report(FIGURES / figure) in readme
    assert "Seeds the rerun needs" in readme
    assert len(readme.splitlines()) <= 250


def test_verdict_of_a_figure_folder_judges_each_of_its_runs(capsys):
    from sandbox.cli import main
    assert main(["verdict", str(FIGURES / "sse_state_scaling")]) == 0
    out = capsys.readouterr().out
    assert out.index("## conv") < out.index("## no_conv")
    assert out.count("**3: k = n recalls like GLA") == 2
    assert "not compared: GLA is not above chance (0.031)" in out
    assert main(["verdict", str(FIGURES / "sla_heads"), "--plan"]) == 0
    assert "| gain(16) - gain(4) | effect > +0.05 | +0.15 |" in capsys.readouterr().out


# ---- SSE state scaling: claims 1-3 ----------------------------------------------------------------------------------

GRID = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8)]


def scaling(sse, gla, attention=None):
    """The conv file's rows: sse {(n, k): accuracies}, dense GLA, GLA top-k at chance, and the control."""
    cells = [({"model.mixer": "sse", "model.sse.n": n, "model.sse.k": k, "model.gla.topk": None}, sse[(n, k)])
             for n, k in GRID]
    cells += [({"model.mixer": "gla", "model.gla.topk": None}, gla),
              ({"model.mixer": "gla", "model.gla.topk": 8}, tight(0.03))]
    return cells + ([({"model.mixer": "attention"}, attention)] if attention else [])


def scaling_claims(tmp_path, sse, gla=tight(0.6), attention=None):
    return judge(write_rows(tmp_path, "sse_state_scaling_conv", scaling(sse, gla, attention)))


def test_scaling_claims_hold_on_a_true_effect_and_fail_on_a_null(tmp_path):
    """Truth: recall set by n (0.3, 0.6, 0.9 at n 2, 4, 8), k/n 1/2 above k = 1 and k = n no better, k = n at GLA's
    0.6 where n is 4. Null: every cell alike."""
    level = {1: 0.6, 2: 0.3, 4: 0.6, 8: 0.9}
    truth = {(n, k): tight(level[n] - (0.2 if k == 1 and n >= 4 else 0)) for n, k in GRID}
    control, (one, two, three, *_) = scaling_claims(tmp_path / "true", truth, attention=tight(0.995))
    assert control.passes()
    assert (one.verdict(), two.verdict()) == ("holds", "holds")
    assert outcomes(three) == ["holds", "does not hold", "holds", "does not hold"]   # n2 and n8 unlike GLA's 0.6
    _, (one, two, three, *_) = scaling_claims(tmp_path / "null", {p: tight(0.6) for p in GRID})
    assert (one.verdict(), two.verdict(), three.verdict()) == ("does not hold", "does not hold", "holds")
    no_saturation = {**{p: tight(0.6) for p in GRID}, (4, 1): tight(0.2), (8, 1): tight(0.2), (8, 8): tight(0.9)}
    _, (_, two, *_) = scaling_claims(tmp_path / "rises", no_saturation)
    assert outcomes(two) == ["holds", "holds", "holds", "does not hold"] and two.verdict() == "does not hold"


def test_k_equal_n_is_not_compared_with_a_gla_that_learned_nothing(tmp_path):
    """Two models at chance are 'alike' for no reason: the equivalence waits for a GLA that learns."""
    _, claims = scaling_claims(tmp_path, {p: tight(0.02) for p in GRID}, gla=tight(0.02))
    three = claims[2]
    assert three.verdict() == "inconclusive" and all(i.effect is None for i in three.items)
    assert all("GLA is not above chance (0.031) by 0.05" in i.reason for i in three.items)


def test_state_scaling_decides_a_bimodal_effect_the_old_rule_could_not(tmp_path):
    """Recall grows with n as the share of seeds that learn: 3, 15 and 27 of 30 at n 2, 4 and 8."""
    learned = {1: 3, 2: 3, 4: 15, 8: 27}
    _, claims = scaling_claims(tmp_path, {(n, k): bimodal(learned[n]) for n, k in GRID})
    one = claims[0]
    assert one.verdict() == "holds" and outcomes(one) == ["holds", "holds", "holds"]
    assert not any(old_rule_decides(i.a.values, i.b.values) for i in one.items)


# ---- SSE state scaling: the state pictures --------------------------------------------------------------------------

VARIANTS = {"gla": {"model.mixer": "gla", "model.gla.topk": None}, "gla-topk": {"model.mixer": "gla",
                                                                                  "model.gla.topk": 8},
            "sse-n4k1": {"model.mixer": "sse", "model.sse.n": 4, "model.sse.k": 1}}


def write_states(tmp_path, runs, retrained=None):
    """runs: {variant: [(accuracy, row similarity, sv entropy, receptive field in tokens) per seed]}, as the sweep's
    rows and `sandbox inspect`'s summary.json (two layers: the value and 0.02 above it; receptive field cap 200).
    retrained: {(variant, seed): the retrained model's accuracy}."""
    d = write_rows(tmp_path, "sse_state_scaling_conv", [(VARIANTS[v], [r[0] for r in seeds])
                                                        for v, seeds in runs.items()])
    for variant, seeds in runs.items():
        for seed, (_, sim, ent, rf) in enumerate(seeds):
            out = d / "state_pictures" / f"{variant}-seed{seed}"
            out.mkdir(parents=True)
            layers = {str(l): {"row_similarity": sim + 0.02 * l, "sv_entropy": ent + 0.02 * l,
                               "receptive_field": rf + 4 * l, "receptive_field_cap": 200.0} for l in (0, 1)}
            summary = {"layers": layers}
            if (variant, seed) in (retrained or {}):
                summary["retrained_from"] = {"run_dir": "trials/x", "best_accuracy": seeds[seed][0],
                                             "retrained_best_accuracy": retrained[(variant, seed)]}
            (out / "summary.json").write_text(json.dumps(summary))
    return d


def test_state_claims_compare_runs_that_learned_and_hold_or_fail_by_the_rule(tmp_path):
    """All runs learned (0.95). Both sparse variants' rows clearly less alike than GLA's: holds; SSE's entropy at
    below GLA's: does not hold; receptive fields 40 tokens longer (0.2 of the cap): holds."""
    runs = {"gla": [(0.95, 0.80 + e, 0.10 + e, 100 + 100 * e) for e in (0, 0.01, 0.02)],
            "gla-topk": [(0.95, 0.40 + e, 0.30 + e, 140 + 100 * e) for e in (0, 0.01, 0.02)],
            "sse-n4k1": [(0.96, 0.50 + e, 0.05 + e, 140 + 100 * e) for e in (0, 0.01, 0.02)]}
    sim, ent, rf = verdicts(write_states(tmp_path, runs))[3:]
    assert outcomes(sim) == ["holds", "holds"] and sim.verdict() == "holds"
    assert sim.items[0].a.values == pytest.approx([0.81, 0.82, 0.83])      # GLA's mean over its two layers
    assert outcomes(ent) == ["holds", "does not hold"] and ent.verdict() == "does not hold"
    assert rf.items[0].effect.estimate == pytest.approx(0.2) and rf.verdict() == "holds"


def test_state_claims_leave_out_runs_that_did_not_learn_and_say_why_none_is_compared(tmp_path):
    """GLA top-k's seed 2 did not learn (0.3) and its seed 1 learned in the sweep but not when trained again for its
    picture: only seed 0 counts. No GLA run learned: nothing is compared, and the table says why."""
    runs = {"gla": [(0.95, 0.8, 0.1, 100.0), (0.97, 0.8, 0.1, 100.0), (0.96, 0.81, 0.1, 100.0)],
            "gla-topk": [(0.95, 0.4, 0.3, 140.0), (0.95, 0.9, 0.3, 140.0), (0.3, 0.9, 0.3, 140.0)],
            "sse-n4k1": [(0.5, 0.4, 0.3, 140.0)] * 3}
    sim = verdicts(write_states(tmp_path / "a", runs, retrained={("gla-topk", 1): 0.01}))[3]
    topk, sse = sim.items
    assert topk.b.seeds == [0] and topk.b.values == pytest.approx([0.41])
    assert topk.reason is None and topk.effect is not None                 # one seed on one side: no interval
    assert sse.reason == "sse-n4k1 learned in 0 of 3 picture runs" and sse.effect is None
    assert sim.verdict() == "inconclusive"
    runs["gla"] = [(0.2, 0.8, 0.1, 100.0)] * 3
    sim = verdicts(write_states(tmp_path / "b", runs))[3]
    assert sim.items[0].reason == "gla learned in 0 of 3 picture runs" and sim.verdict() == "inconclusive"
    assert "not compared: gla learned in 0 of 3 picture runs" in sim.markdown()


@pytest.mark.slow
def test_inspect_a_sweep_draws_the_state_pictures_of_each_variants_best_run(tmp_path):
    """A real (tiny, CPU) sweep with the state-scaling figure's name and variants; `sandbox inspect SWEEP_DIR`
    inspects, per variant and seed, the learning rate with the best accuracy (checked against the runs' own
    result.json), draws pictures for seed 0 only, and `sandbox verdict` then leaves the state claims uncompared:
    no tiny run learned."""
    import os
    import subprocess
    import sys

    from sandbox.cli import main
    spec = {"name": "sse_state_scaling",
            "base": {"seed": 0,
                     "task": {"name": "mqar", "seq_len": 24, "num_kv_pairs": 4, "vocab_size": 32, "noise": 4,
                              "test_examples": 32},
                     "model": {"mixer": "gla", "d_model": 32, "n_layers": 2, "n_heads": 1, "channel_mixer": "none"},
                     "train": {"steps": 20, "batch_size": 8, "eval_every": 10, "eval_batch_size": 32,
                               "log_every": 10, "early_stop": None}},
            "grid": {"seed": [0, 1, 2],
                     "model.mixer, model.sse.n, model.sse.k, model.gla.topk, model.gla.conv_size":
                         [["gla", 4, 1, None, 0], ["gla", 4, 1, 8, 0], ["sse", 4, 1, None, 0]]},
            "tune": {"train.lr": [1e-3, 1e-2]},
            "objective": {"metric": "test/accuracy", "mode": "best"}}
    path, out = tmp_path / "s.yaml", tmp_path / "sweep"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out), "--no-live",
                        "--workers", "1"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "results.csv")))
    for r in rows:       # as after a sweep whose calls ran on different machines: top-k's checkpoints are gone
        if r["model.gla.topk"] == "8":
            (out / r["run_dir"] / "checkpoint.pt").unlink()
    assert main(["inspect", str(out), "--figure", str(FIGURES / "sse_state_scaling")]) == 0
    moved = tmp_path / "figures" / "sse_state_scaling"       # as figures/<figure>/ holds it: the runs named
    moved.parent.mkdir()                                     # relative to the sweep directory still resolve
    out = out.rename(moved)
    for variant, match in (("gla", lambda r: r["model.mixer"] == "gla" and r["model.gla.topk"] in ("", "None")),
                           ("gla-topk", lambda r: r["model.mixer"] == "gla" and r["model.gla.topk"] == "8"),
                           ("sse-n4k1", lambda r: r["model.mixer"] == "sse")):
        for seed in range(3):
            runs = [out / r["run_dir"] for r in rows if match(r) and r["seed"] == str(seed)]
            assert len(runs) == 2
            acc = {d.resolve(): json.loads((d / "result.json").read_text())["best_accuracy"] for d in runs}
            got = out / "state_pictures" / f"{variant}-seed{seed}"
            summary = json.loads((got / "summary.json").read_text())
            if variant == "gla-topk":    # trained again from the best run's recorded configuration
                again = summary["retrained_from"]
                assert acc[(out / again["run_dir"]).resolve()] == max(acc.values()) == again["best_accuracy"]
                assert abs(again["retrained_best_accuracy"] - again["best_accuracy"]) <= 2 / 32, again
            else:
                assert acc[(out / summary["run_dir"]).resolve()] == max(acc.values())  # one of this cell's runs
            assert summary["layers"]["0"]["row_similarity"] is not None
            assert bool(list(got.glob("*.png"))) == (seed == 0)
    claims = verdicts(out, figure=FIGURES / "sse_state_scaling")
    assert len(claims) == 6
    assert all("learned in 0 of 3 picture runs" in i.reason for c in claims[3:] for i in c.items)


# ---- SSE ablations ---------------------------------------------------------------------------------------------------

def ablations(default, silu=None, separate=None, gates=None, attention=None):
    """The rerun's rows (a mixer column; the control's sse columns repeat the default's, and must not count)."""
    row = lambda key_map="softmax", shared=True, gate="write_read": {                      # noqa: E731
        "model.mixer": "sse", "model.sse.key_map": key_map, "model.sse.shared_params": shared, "model.sse.gate": gate}
    cells = [(row(), default), (row(key_map="silu"), silu or default), (row(shared=False), separate or default)]
    cells += [(row(gate=g), (gates or {}).get(g, default)) for g in ("read", "none", "write")]
    return cells + [({**row(), "model.mixer": "attention"}, attention or tight(0.995))]


def test_ablation_claims_hold_on_a_true_effect_and_fail_on_a_null(tmp_path):
    cells = ablations(tight(0.7), silu=tight(0.4), separate=tight(0.71), gates={g: tight(0.6) for g in
                                                                                  ("read", "none", "write")})
    control, claims = judge(write_rows(tmp_path / "true", "sse_ablations", cells))
    assert control.passes() and claims[0].items[0].a.values == pytest.approx(tight(0.7))   # the control left out
    assert [c.verdict() for c in claims] == ["holds", "holds", "holds"]
    null = ablations(tight(0.7), separate=tight(0.9))            # keys and gates alike; separate clearly better
    _, claims = judge(write_rows(tmp_path / "null", "sse_ablations", null))
    assert [c.verdict() for c in claims] == ["does not hold"] * 3


def test_ablations_decide_a_bimodal_effect_the_old_rule_could_not(tmp_path):
    """Softmax keys learn in 21 of 30 seeds, SiLU keys in 3."""
    keys = judge(write_rows(tmp_path, "sse_ablations", ablations(bimodal(21), silu=bimodal(3))))[1][0]
    assert keys.verdict() == "holds"
    assert not old_rule_decides(keys.items[0].a.values, keys.items[0].b.values)



def test_a_control_calibrated_alone_is_found_through_its_sweeps_base(tmp_path):
    """A control's own sweep (sse_ablations_control.yaml) sets the mixer in its base and varies only the seed, so its
    results have no model.mixer column: the control is read from the base's value, and a base of another mixer
    leaves it not run."""
    def calibration(d, mixer, accs):
        write_rows(d, "sse_ablations", [({}, accs)])
        spec = yaml.safe_load((d / "sweep.yaml").read_text())
        spec["base"]["model"] = {"mixer": mixer}
        (d / "sweep.yaml").write_text(yaml.safe_dump(spec))
        return judge(d)[0]
    passes = calibration(tmp_path / "a", "attention", tight(0.995))
    assert passes.passes() and [c.n for c in passes.cells.values()] == [5]
    fails = calibration(tmp_path / "b", "attention", [0.995, 0.13, 0.998])
    assert not fails.passes() and [c.n for c in fails.cells.values()] == [3]
    assert list(calibration(tmp_path / "c", "sse", tight(0.995)).cells.values()) == [None]

# ---- SLA heads -------------------------------------------------------------------------------------------------------

def heads(sla_cells: dict, gla_cells: dict | None = None, attention=None):
    """SLA ({H: accuracies}) and GLA (default 0.2 +- 0.01) with conv 4 at H 4, 8, 16; the control's rows."""
    cells = []
    for h in (4, 8, 16):
        cells += [(sla("gla", h), (gla_cells or {}).get(h, tight(0.2))), (sla("sla", h), sla_cells[h])]
        cells += [({"model.mixer": "attention", "model.n_heads": h}, attention)] if attention else []
    return cells


def test_sla_contrast_is_a_difference_of_differences_and_holds_or_fails_by_the_rule(tmp_path):
    grows = heads({4: tight(0.3), 8: tight(0.4), 16: tight(0.6)}, attention=tight(0.995))
    control, (claim,) = judge(write_rows(tmp_path / "a", "sla_heads", grows))
    assert control.passes()
    assert claim.items[0].effect.estimate == pytest.approx((0.6 - 0.2) - (0.3 - 0.2)) and claim.verdict() == "holds"
    flat = heads({h: tight(0.5) for h in (4, 8, 16)})
    assert judge(write_rows(tmp_path / "b", "sla_heads", flat))[1][0].verdict() == "does not hold"
    shrinks = heads({4: tight(0.5), 8: tight(0.3), 16: tight(0.2)})
    assert judge(write_rows(tmp_path / "c", "sla_heads", shrinks))[1][0].verdict() == "does not hold"


def test_sla_decides_a_bimodal_growth_the_old_rule_could_not(tmp_path):
    """SLA and GLA learn in 15 of 30 seeds at H = 4 (no gain); at H = 16 SLA in 27 and GLA in 6."""
    cells = heads({4: bimodal(15), 8: bimodal(15), 16: bimodal(27)}, {4: bimodal(15), 8: bimodal(15), 16: bimodal(6)})
    claim = judge(write_rows(tmp_path, "sla_heads", cells))[1][0]
    assert claim.verdict() == "holds"
    sla16, gla16, sla4, gla4 = (c.values for _, c in claim.items[0].terms)
    s = {h: math.hypot(statistics.stdev(a), statistics.stdev(b)) for h, a, b in ((4, sla4, gla4), (16, sla16, gla16))}
    growth = (statistics.mean(sla16) - statistics.mean(gla16)) - (statistics.mean(sla4) - statistics.mean(gla4))
    assert abs(growth) <= 2 * max(s.values())                   # the old rule: |growth| > 2 max(s(4), s(16))


# ---- the figures being rerun: Figure 8 and Zoology Figure 2 ----------------------------------------------------------

def test_fig8_holds_on_a_true_effect_fails_on_a_null_and_decides_bimodal_seeds(tmp_path):
    wide = fig8(tight(0.9), tight(0.1), d=256) + fig8(tight(0.5), tight(0.1), d=64)
    a, b = verdicts(write_rows(tmp_path / "true", "sse_fig8_topk", fig8(tight(0.8), tight(0.2)) + wide))
    assert (a.verdict(), b.verdict()) == ("holds", "holds")
    flat = fig8(tight(0.5), tight(0.5)) + fig8(tight(0.5), tight(0.1), d=256) + fig8(tight(0.5), tight(0.1), d=64)
    a, b = verdicts(write_rows(tmp_path / "null", "sse_fig8_topk", flat))
    assert (a.verdict(), b.verdict()) == ("does not hold", "does not hold")
    a = verdicts(write_rows(tmp_path / "bimodal", "sse_fig8_topk", fig8(bimodal(21), bimodal(3))))[0]
    assert a.verdict() == "holds" and not any(old_rule_decides(i.a.values, i.b.values) for i in a.items)


def zoology(d256, d64, small=None):
    """The fixed-state models at (512, 64) (d256 and d64) and at (64, 4) (``small``: d64 and d256, default 0.99)."""
    small = small or (tight(0.99), tight(0.99))
    cells = []
    for mixer, topk in (("gla", False), ("gla", True), ("sse", False), ("gated_deltanet", False)):
        for (seq, pairs), d, accs in (((512, 64), 256, d256), ((512, 64), 64, d64), ((64, 4), 64, small[0]),
                                      ((64, 4), 256, small[1])):
            grid = {"model.mixer": mixer, "model.d_model": d, "task.seq_len": seq, "task.num_kv_pairs": pairs}
            if mixer == "gla":
                grid.update({"model.gla.topk": d // 8 if topk else None, "model.gla.conv_size": 4})
            cells.append((grid, accs))
    return cells


def test_zoology_holds_on_a_true_effect_fails_on_a_null_and_decides_bimodal_seeds(tmp_path):
    width, small = verdicts(write_rows(tmp_path / "true", "zoology_fig2", zoology(tight(0.9), tight(0.3))))
    assert (width.verdict(), small.verdict()) == ("holds", "holds")
    null = zoology(tight(0.9), tight(0.9), small=(tight(0.5), tight(0.99)))
    width, small = verdicts(write_rows(tmp_path / "null", "zoology_fig2", null))
    assert (width.verdict(), small.verdict()) == ("does not hold", "does not hold")
    width = verdicts(write_rows(tmp_path / "bimodal", "zoology_fig2", zoology(bimodal(21), bimodal(3))))[0]
    assert width.verdict() == "holds" and not any(old_rule_decides(i.a.values, i.b.values) for i in width.items)


def test_a_claim_whose_rows_have_not_run_says_so_in_its_headline():
    """Inconclusive because two of its three items have no cells yet, not because the seeds could not decide; once
    the items ran (here: alike, a clear null for "above by 0.2"), the claim is decided and the note goes."""
    from sandbox.analysis import stats
    from sandbox.analysis.verdicts.claims import Cell, Claim
    ran = Cell([0.9, 0.91, 0.92], [0, 1, 2])
    partial = Claim("beats")
    partial.compare("G 1", ran, Cell([0.1, 0.11, 0.12], [0, 1, 2]), stats.greater(0.2))
    partial.compare("G 2", ran, None, stats.greater(0.2))
    partial.compare("G 3", None, None, stats.greater(0.2))
    assert partial.verdict() == "inconclusive"
    assert partial.markdown().startswith("**beats**: inconclusive: 2 of 3 items not run yet\n")
    full = Claim("beats")
    for g in ("G 1", "G 2", "G 3"):
        full.compare(g, ran, ran, stats.greater(0.2))
    assert full.markdown().startswith("**beats**: does not hold\n")


def test_an_undecided_item_says_when_deciding_it_would_decide_its_claim():
    """Every item must hold: one "does not hold" settles the claim, so each open item says so. Two of three must
    hold and one already does: one more "holds" settles it. Once the claim is decided, no item says anything."""
    from sandbox.analysis import stats
    from sandbox.analysis.verdicts.claims import Cell, Claim
    high, low = Cell([0.9, 0.91, 0.92], [0, 1, 2]), Cell([0.1, 0.11, 0.12], [0, 1, 2])
    wide_a, wide_b = Cell([0.1, 0.9, 0.5], [0, 1, 2]), Cell([0.2, 0.1, 0.6], [0, 1, 2])

    def claim(need, pairs):
        c = Claim("beats", need=need)
        for i, (a, b) in enumerate(pairs):
            c.compare(f"G {i}", a, b, stats.greater(0.2))
        return c
    every = claim(None, [(high, low), (wide_a, wide_b), (wide_a, wide_b)])
    assert every.judged() == ("inconclusive", ["holds", "inconclusive", "inconclusive"])
    assert every.markdown().count("(if this item does not hold, neither does the claim)") == 2
    most = claim(2, [(high, low), (wide_a, wide_b), (wide_a, wide_b)])
    assert most.verdict() == "inconclusive" and most.markdown().count("(if it holds, so does the claim)") == 2
    assert "neither does" not in most.markdown()           # one "does not hold" leaves 2 of 3 possible
    decided = claim(None, [(low, high), (wide_a, wide_b)])
    assert decided.verdict() == "does not hold" and "claim)" not in decided.markdown()


def test_the_budget_check_counts_trials_still_improving_and_rates_at_the_grids_ends(tmp_path):
    """Three seeds x three rates of one mixer. Seed 0 learned at every rate, best at its last step (3000) at rate
    8e-3, the grid's top: 3 trials still improving, one rate at an end. Seed 1 reached the early stop at step 1500
    at 2e-3 (not improving, and its rate not counted: solved). Seed 2 stayed at chance (not counted at all)."""
    from sandbox.analysis.verdicts.checks import budget_check
    d = tmp_path / "run"
    d.mkdir()
    (d / "sweep.yaml").write_text(yaml.safe_dump({"name": "sla_heads", "base": {
        "task": {"name": "mqar", "num_kv_pairs": 16}, "train": {"steps": 3000, "early_stop": 0.99}}}))
    rows = []
    for lr, acc in ((5e-4, 0.4), (2e-3, 0.5), (8e-3, 0.6)):
        rows.append((0, lr, acc, acc, 3000, 3000))
    for lr, (acc, step) in ((5e-4, (0.7, 3000)), (2e-3, (0.995, 1500)), (8e-3, (0.3, 2500))):
        rows.append((1, lr, acc, acc, step, step if acc >= 0.99 else 3000))
    for lr in (5e-4, 2e-3, 8e-3):
        rows.append((2, lr, 0.0, 0.0, 3000, 3000))
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "status", "seed", "model.mixer", "train.lr", "best_val_accuracy", "test_at_best_val",
                    "best_val_step", "steps"])
        for n, (seed, lr, val, test, step, steps) in enumerate(rows):
            w.writerow([n, "complete", seed, "gla", lr, val, test, step, steps])
    text = budget_check(Table(d))
    # learned: seed 0's three, seed 1's three; still improving at the end: seed 0's three and seed 1's 5e-4
    assert "of the 6 trials" in text and "4 (67%) chose the last step" in text and "Most were still improving" in text
    assert "chosen for 1 such seed short of the early stop, 1 lie at an end" in text
    assert budget_check(Table(write_rows(tmp_path / "none", "sla_heads", [(sla("gla", 4), [0.0, 0.0])]))) is None
