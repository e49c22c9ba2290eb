"""`sandbox verdict`: the fixed criteria of figures/NAME/README.md, computed by each figure's own verdict.py from a
sweep's rows, against outcomes built into synthetic results by construction; and how a sweep directory finds its
figure's code."""
import csv
import itertools
import json
from pathlib import Path

import pytest
import yaml

from sandbox.analysis.verdicts import Cell, Table, verdicts

FIGURES = Path(__file__).resolve().parent.parent / "figures"
FOLDER = {"sse_fig8_topk": "sse_fig8_topk", "sse_state_scaling": "sse_state_scaling",
          "sse_state_scaling_conv": "sse_state_scaling", "sse_ablations": "sse_ablations", "sla_heads": "sla_heads",
          "zoology_fig2": "zoology_fig2"}


def record_source(d, name):
    """As `sandbox sweep figures/FOLDER/NAME.yaml` leaves its directory: sweep.json names the sweep file."""
    (d / "sweep.json").write_text(json.dumps({"study": name, "source": str(FIGURES / FOLDER[name] / f"{name}.yaml")}))

MIXERS = ("gla", "metala", "gsa")
SETTINGS = ((192, 0), (0, 192))
COLS = ["trial", "status", "point_id", "seed", "model.mixer", "model.d_model", "model.gsa.topk", "model.gla.conv_size",
        "task.gap", "task.noise", "train.lr", "best_accuracy"]


def write(tmp_path, cells):
    """cells: {(mixer, (gap, noise), d_model, topk, conv): [best accuracy per seed]}; each seed gets a second,
    worse learning rate and a failed trial (accuracy 0), which must not count."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "sse_fig8_topk", "base": {"task": {"name": "mqar", "num_kv_pairs": 16}}}))
    record_source(tmp_path, "sse_fig8_topk")
    rows = []
    for (mixer, (gap, noise), d, topk, conv), accs in cells.items():
        for seed, acc in enumerate(accs):
            for lr, a, status in ((2e-3, acc, "complete"), (5e-4, acc / 2, "complete"), (8e-3, 0, "failed")):
                point = f"{mixer}-{gap}-{noise}-{d}-{topk}-{conv}-{seed}"
                rows.append([len(rows), status, point, seed, mixer, d, 16 if topk else "", conv, gap, noise, lr, a])
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS)
        w.writerows(rows)
    return tmp_path


def pairs(topk, dense, d=128, conv=4, only=None):
    """Every Figure 8 pair at one width: the same seeds' values for each, except where ``only`` says."""
    out = {}
    for m, s in itertools.product(MIXERS, SETTINGS):
        t, dn = (only or {}).get((m, s), (topk, dense))
        if t is not None:
            out[(m, s, d, True, conv)] = t
        if dn is not None:
            out[(m, s, d, False, conv)] = dn
    return out


def test_a_beats_b_by_the_fixed_rule(tmp_path):
    t = Table(write(tmp_path, {}))
    assert t.chance == 0.125
    assert t.beats(Cell([0.5, 0.6, 0.7]), Cell([0.2, 0.2, 0.2]))          # 0.4 > 2 x 0.1
    assert not t.beats(Cell([0.2, 0.5, 0.8]), Cell([0.2, 0.2, 0.2]))      # 0.3 < 2 x 0.3
    assert not t.beats(Cell([0.12, 0.12, 0.12]), Cell([0.0, 0.0, 0.0]))  # a at chance
    assert not t.beats(Cell([0.23, 0.23, 0.23]), Cell([0.2, 0.2, 0.2]))   # less than 0.03 apart
    assert not t.signal(Cell([0.995]), Cell([0.999])) and not t.signal(Cell([0.1]), Cell([0.05]))


def test_claim_a_holds_with_five_pairs_top_k_better(tmp_path):
    cells = pairs([0.9, 0.91, 0.92], [0.3, 0.31, 0.32],
                  only={("gsa", (0, 192)): ([0.5, 0.6, 0.7], [0.45, 0.5, 0.55])})     # one pair: neither
    a = verdicts(write(tmp_path, cells))[0]
    assert a.verdict() == "holds"
    assert [o for _, _, o in a.items].count("top-k better") == 5 and a.items[-1][2] == "neither"


def test_claim_a_with_two_pairs_missing_lists_what_is_still_possible(tmp_path):
    """Two top-k better, two neither (signal), two not run: 'holds' is out of reach; a GSA pair top-k better
    makes it inconclusive, none does not hold (Figure 8 part 1 part way, 2026-11-23)."""
    only = {("metala", s): ([0.3, 0.5, 0.8], [0.03, 0.04, 0.03]) for s in SETTINGS}
    only.update({("gsa", s): (None, None) for s in SETTINGS})
    a = verdicts(write(tmp_path, pairs([0.9, 0.95, 0.99], [0.01, 0.5, 0.0], only=only)))[0]
    assert a.verdicts == {"does not hold", "inconclusive"}
    assert a.verdict() == "open: does not hold or inconclusive"


def test_a_pair_without_signal_at_d128_is_decided_at_the_other_widths(tmp_path):
    cells = pairs([0.05, 0.06, 0.05], [0.05, 0.05, 0.06])                 # all at chance at d128
    cells.update(pairs([0.5], [0.3], d=64))
    cells.update(pairs([0.8], [0.6], d=256))
    a = verdicts(write(tmp_path, cells))[0]
    assert all(o == "top-k better" for _, _, o in a.items) and a.verdict() == "holds"
    cells.update(pairs([0.5], [0.45], d=64))                              # 0.05 < 0.10 at d64
    a = verdicts(write(tmp_path, cells))[0]
    assert all(o == "neither" for _, _, o in a.items) and a.verdict() == "does not hold"


def test_claim_b_rises_falls_and_tolerance(tmp_path):
    """Tolerance t = max(0.03, 2 sd of the 3-seed d128 top-k cell) = 0.2 here: a dip of 0.1 is tolerated,
    one of 0.3 is a fall."""
    cells = pairs([0.5, 0.6, 0.7], [0.1, 0.1, 0.1])
    cells.update(pairs([0.3], [0.1], d=64))
    cells.update(pairs([0.9], [0.1], d=256))
    b = verdicts(write(tmp_path, cells))[1]
    assert all(o == "rises" for _, _, o in b.items) and b.verdict() == "holds"
    cells.update(pairs([0.6], [0.1], d=64))                                # 0.6 -> 0.5: within t
    assert verdicts(write(tmp_path, cells))[1].verdict() == "holds"
    cells.update(pairs([0.81], [0.1], d=64))                               # 0.81 -> 0.5: falls, everywhere
    b = verdicts(write(tmp_path, cells))[1]
    assert all(o == "falls" for _, _, o in b.items) and b.verdict() == "does not hold"


def test_conv_off_sign_survives_or_changes(tmp_path):
    cells = pairs([0.9, 0.9, 0.9], [0.2, 0.2, 0.2])
    cells.update(pairs([0.6], [0.3], conv=0))
    assert verdicts(write(tmp_path, cells))[2].verdict() == "survives"
    cells.update(pairs([0.3], [0.6], conv=0))
    assert verdicts(write(tmp_path, cells))[2].verdict() == "changes"
    cells.update(pairs([0.35], [0.3], conv=0))
    assert verdicts(write(tmp_path, cells))[2].verdict() == "no signal without conv"


def test_a_sweep_without_criteria_is_a_clear_error(tmp_path):
    write(tmp_path, {})
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"name": "other", "base": {"task": {"num_kv_pairs": 8}}}))
    with pytest.raises(ValueError, match="holds sweep 'other', but the sweep files of .*sse_fig8_topk name "
                                         "sse_fig8_topk$"):
        verdicts(tmp_path)
    (tmp_path / "sweep.json").unlink()
    with pytest.raises(ValueError, match="has no figure code.*pass --figure figures/NAME"):
        verdicts(tmp_path)


def test_a_sweep_directory_finds_its_figure_beside_its_sweep_file_in_itself_or_by_figure(tmp_path):
    """The same rows judged through the three ways to the figure's code give the same claims, and the committed
    run of Figure 8 gives the verdicts its README states."""
    cells = pairs([0.9, 0.91, 0.92], [0.3, 0.31, 0.32])
    by_source = verdicts(write(tmp_path / "a", cells))
    (tmp_path / "a" / "sweep.json").unlink()
    by_flag = verdicts(tmp_path / "a", figure=FIGURES / "sse_fig8_topk")
    inside = tmp_path / "fig" / "run"                    # a figure folder holding its run one folder down
    write(inside, cells).joinpath("sweep.json").unlink()
    (tmp_path / "fig" / "verdict.py").write_text((FIGURES / "sse_fig8_topk" / "verdict.py").read_text())
    (tmp_path / "fig" / "part1.yaml").write_text("name: sse_fig8_topk\n")
    by_folder = verdicts(inside)
    assert [c.items for c in by_flag] == [c.items for c in by_source] == [c.items for c in by_folder]
    assert [c.verdict() for c in verdicts(FIGURES / "sse_fig8_topk" / "run")] == ["does not hold", "holds", "inconclusive"]


def test_verdict_of_a_figure_folder_judges_each_of_its_runs(capsys):
    from sandbox.cli import main
    assert main(["verdict", str(FIGURES / "sse_state_scaling")]) == 0
    out = capsys.readouterr().out
    assert out.index("## conv") < out.index("## no_conv")
    assert out.count("**3: k = n is like GLA") == 2
    assert "**3: k = n is like GLA with conv (3 seeds)**: holds" in out


def write_rows(tmp_path, name, num_kv_pairs, cells):
    """cells: [(grid values, [best accuracy per seed])], written as one complete trial per seed plus a
    worse learning rate."""
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": name, "base": {"task": {"name": "mqar", "num_kv_pairs": num_kv_pairs}}}))
    record_source(tmp_path, name)
    cols = sorted(set().union(*(g.keys() for g, _ in cells)))
    with open(tmp_path / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "status", "seed", *cols, "train.lr", "best_accuracy"])
        n = 0
        for grid, accs in cells:
            for seed, acc in enumerate(accs):
                for lr, a in ((2e-3, acc), (8e-3, acc / 3)):
                    w.writerow([n, "complete", seed, *("" if grid.get(c) is None else grid.get(c) for c in cols),
                                lr, a])
                    n += 1
    return tmp_path


def sse(n, k, accs):
    return ({"model.mixer": "sse", "model.sse.n": n, "model.sse.k": k, "model.gla.topk": None,
             "model.gla.conv_size": 0}, accs)


def test_state_scaling_claims(tmp_path):
    """Recall set by n alone (k/n does not matter beyond 1/2): claim 1 holds; at n4 and n8 k/n 1/2 beats
    k1 and k = n adds nothing, so claim 2 holds; k = n matches GLA at n1 and n2 only, so claim 3 does not
    hold."""
    level = {1: 0.22, 2: 0.27, 4: 0.5, 8: 0.8}
    cells = [sse(n, k, [level[n] - (0.1 if k == 1 and n >= 4 else 0) + e for e in (0.0, 0.01, 0.02)])
             for n, k in [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8)]]
    cells.append(({"model.mixer": "gla", "model.gla.topk": None, "model.gla.conv_size": 0}, [0.24, 0.25, 0.26]))
    one, two, three = verdicts(write_rows(tmp_path, "sse_state_scaling", 32, cells))[:3]
    assert [o for _, _, o in one.items] == ["gain", "gain", "gain"] and one.verdict() == "holds"
    assert two.verdict() == "holds"
    assert [o for _, _, o in three.items] == ["alike", "alike", "not alike", "not alike"]
    assert three.verdict() == "does not hold"
    at_chance = [sse(n, k, [0.01, 0.02, 0.01]) for n, k in [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4),
                                                            (8, 1), (8, 2), (8, 4), (8, 8)]]
    for claim in verdicts(write_rows(tmp_path, "sse_state_scaling", 32, at_chance + cells[-1:]))[:3]:
        assert claim.verdict() == "inconclusive (every SSE cell at chance)"


def test_state_scaling_with_conv_compares_k_equal_n_with_the_gla_row_of_that_file(tmp_path):
    """sse_state_scaling_conv has conv 4 on every row and no conv column: claim 3 takes its one dense GLA row."""
    level = {1: 0.22, 2: 0.27, 4: 0.5, 8: 0.8}
    cells = [({"model.mixer": "sse", "model.sse.n": n, "model.sse.k": k, "model.gla.topk": None},
              [level[n] + e for e in (0.0, 0.01, 0.02)])
             for n, k in [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8)]]
    gla = ({"model.mixer": "gla", "model.gla.topk": None}, [0.49, 0.5, 0.51])
    topk = ({"model.mixer": "gla", "model.gla.topk": 8}, [0.01, 0.02, 0.03])
    three = verdicts(write_rows(tmp_path, "sse_state_scaling_conv", 32, cells + [gla, topk]))[2]
    assert "with conv" in three.name
    assert [o for _, _, o in three.items] == ["not alike", "not alike", "alike", "not alike"]
    assert three.verdict() == "does not hold"


def ablation(accs, key_map="softmax", shared=True, gate="write_read"):
    return ({"model.sse.key_map": key_map, "model.sse.shared_params": shared, "model.sse.gate": gate}, accs)


def test_ablation_claims(tmp_path):
    five = lambda m: [m - 0.02, m - 0.01, m, m + 0.01, m + 0.02]     # noqa: E731  (sd 0.0158)
    cells = [ablation(five(0.6)), ablation(five(0.4), key_map="silu"), ablation(five(0.58), shared=False),
             ablation(five(0.5), gate="read"), ablation(five(0.45), gate="none"), ablation(five(0.3), gate="write")]
    keys, shared, gates = verdicts(write_rows(tmp_path, "sse_ablations", 32, cells))
    assert (keys.verdict(), shared.verdict(), gates.verdict()) == ("holds", "holds", "holds")
    cells[2] = ablation(five(0.7), shared=False)                          # separate clearly better
    cells[3] = ablation(five(0.2), gate="read")                           # read falls to last
    cells[1] = ablation(five(0.61), key_map="silu")                       # a tie, but sd 0.016 > 0.015
    keys, shared, gates = verdicts(write_rows(tmp_path, "sse_ablations", 32, cells))
    assert (keys.verdict(), shared.verdict(), gates.verdict()) == ("inconclusive", "does not hold", "inconclusive")


def sla_cells(gains, spread=0.01, conv=4, seeds=5, level=0.2):
    """GLA at ``level`` and SLA at ``level`` + gain per H, ``seeds`` seeds spread evenly over +- spread."""
    out = []
    for h, g in zip((4, 8, 16), gains):
        accs = [level - spread + 2 * spread * i / (seeds - 1) for i in range(seeds)] if seeds > 1 else [level]
        out.append(({"model.mixer": "gla", "model.gla.conv_size": conv, "model.sla.conv_size": conv,
                     "model.n_heads": h}, accs))
        out.append(({"model.mixer": "sla", "model.gla.conv_size": conv, "model.sla.conv_size": conv,
                     "model.n_heads": h}, [a + g for a in accs]))
    return out


def test_sla_gain_grows_with_heads(tmp_path):
    """The claim is judged on the conv 4 rows (5 seeds); the conv-off column (seed 0) does not enter it."""
    off = sla_cells([0.5, 0.0, -0.5], conv=0, seeds=1)
    claim = verdicts(write_rows(tmp_path, "sla_heads", 16, sla_cells([0.0, 0.1, 0.2]) + off))[0]
    assert "with conv" in claim.name and claim.verdict() == "holds"       # 0.2 > 0.03 and > 2 x 0.013
    claim = verdicts(write_rows(tmp_path, "sla_heads", 16, sla_cells([0.2, 0.1, 0.0])))[0]
    assert claim.verdict() == "does not hold"
    claim = verdicts(write_rows(tmp_path, "sla_heads", 16, sla_cells([0.1, 0.3, 0.1])))[0]
    assert claim.verdict() == "does not hold"                             # no growth, a tight tie (s 0.013)
    claim = verdicts(write_rows(tmp_path, "sla_heads", 16, sla_cells([0.1, 0.3, 0.1], spread=0.05)))[0]
    assert claim.verdict() == "inconclusive"                              # no growth, too noisy for a tie
    claim = verdicts(write_rows(tmp_path, "sla_heads", 16, sla_cells([0.0, 0.1, 0.2], seeds=3)))[0]
    assert claim.verdict().startswith("open")                             # seeds 3 and 4 not run yet


def test_sla_conv_off_column_keeps_or_flips_the_sign(tmp_path):
    on = sla_cells([0.0, 0.1, 0.2])
    robust = lambda off: verdicts(write_rows(tmp_path, "sla_heads", 16, on + off))[1]   # noqa: E731
    assert robust(sla_cells([0.0, 0.05, 0.1], conv=0, seeds=1)).verdict() == "survives"
    assert robust(sla_cells([0.1, 0.05, 0.0], conv=0, seeds=1)).verdict() == "changes"
    assert robust(sla_cells([0.1, 0.3, 0.11], conv=0, seeds=1)).verdict() == "no signal without conv"
    assert robust(sla_cells([0.0, 0.0, 0.0], conv=0, seeds=1, level=0.01)).verdict() == "no signal without conv"
    assert robust([]).verdict().startswith("open")


def test_zoology_attention_and_width(tmp_path):
    sizes = [(64, 4), (128, 8), (256, 16), (512, 64)]
    cells = []
    for (seq, pairs), d in itertools.product(sizes, (64, 128, 256)):
        grid = {"task.seq_len": seq, "task.num_kv_pairs": pairs, "model.d_model": d}
        cells.append(({**grid, "model.mixer": "attention"}, [0.99]))
        solved = d >= {64: 64, 128: 64, 256: 128, 512: 256}[seq]          # the width a fixed state needs grows
        for mixer, topk in (("gla", None), ("gla", d // 8)):
            cells.append(({**grid, "model.mixer": mixer, "model.gla.topk": topk, "model.gla.conv_size": 4},
                          [0.95 if solved else 0.3]))
        cells.append(({**grid, "model.mixer": "gated_deltanet"}, [0.95]))   # solves everything at d64
        cells.append(({**grid, "model.mixer": "sse"}, [0.95 if solved else 0.3]))
    attention, width = verdicts(write_rows(tmp_path, "zoology_fig2", 4, cells))
    assert attention.verdict() == "holds"
    assert attention.items[0][2] == "3 of 3 at >= 0.95, 0 below 0.9"
    assert [o for _, _, o in width.items] == ["needs width", "needs width", "needs width", "needs none"]
    assert width.verdict() == "holds"
    cells = [c for c in cells if not (c[0]["model.mixer"] == "attention" and c[0]["task.seq_len"] == 512)]
    attention, _ = verdicts(write_rows(tmp_path, "zoology_fig2", 4, cells))
    assert attention.verdicts == {"holds", "does not hold", "inconclusive"}   # 3 of 12 points still missing
    assert attention.items[3][2] is None                                     # shown as open
    cells += [({"task.seq_len": 512, "task.num_kv_pairs": 64, "model.d_model": d, "model.mixer": "attention"},
               [0.01 if d == 64 else 0.99]) for d in (64, 128, 256)]     # 11 points at 0.99, one below 0.9
    attention, _ = verdicts(write_rows(tmp_path, "zoology_fig2", 4, cells))
    assert attention.verdict() == "inconclusive"
    assert attention.items[3][2] == "2 of 3 at >= 0.95, 1 below 0.9"


# ---- the state pictures (issue 21, item 6) ----------------------------------------------------------

def write_states(tmp_path, per_variant):
    """per_variant: {variant: [(row similarity, sv entropy, receptive field) per seed]}, written as the
    summary.json of `sandbox inspect` (two layers: the first at the value, the second 0.02 above it)."""
    import json
    write_rows(tmp_path, "sse_state_scaling", 32, [])
    for variant, seeds in per_variant.items():
        for seed, (sim, ent, rf) in enumerate(seeds):
            d = tmp_path / "state_pictures" / f"{variant}-seed{seed}"
            d.mkdir(parents=True)
            layers = {str(l): {"row_similarity": sim + 0.02 * l, "sv_entropy": ent + 0.02 * l,
                               "receptive_field": rf + 0.02 * l} for l in (0, 1)}
            (d / "summary.json").write_text(json.dumps({"layers": layers}))
    return tmp_path


def test_state_claims_by_the_fixed_rule(tmp_path):
    """Both sparse variants clearly less alike than GLA: holds. SSE's entropy clearly lower: does not hold.
    Receptive fields within 5% of GLA's: neither, so inconclusive."""
    states = {"gla": [(0.80, 0.10, 40.0), (0.82, 0.11, 41.0), (0.81, 0.12, 40.5)],
              "gla-topk": [(0.45, 0.30, 41.0), (0.47, 0.31, 41.5), (0.46, 0.29, 40.0)],
              "sse-n4k1": [(0.50, 0.02, 40.2), (0.52, 0.03, 41.1), (0.51, 0.02, 40.8)]}
    claims = verdicts(write_states(tmp_path, states))
    sim, ent, rf = claims[3:]
    assert [o for _, _, o in sim.items] == ["as predicted", "as predicted"] and sim.verdict() == "holds"
    assert [o for _, _, o in ent.items] == ["as predicted", "reversed"] and ent.verdict() == "does not hold"
    assert [o for _, _, o in rf.items] == ["neither", "neither"] and rf.verdict() == "inconclusive"
    assert "0.470 ± 0.010 vs 0.820 ± 0.010" in sim.items[0][1]        # means over the two layers


def test_state_claims_with_a_seed_not_inspected_stay_open(tmp_path):
    states = {"gla": [(0.80, 0.10, 40.0)] * 3, "gla-topk": [(0.45, 0.30, 60.0)] * 3,
              "sse-n4k1": [(0.50, 0.30, 60.0)] * 2}
    sim = verdicts(write_states(tmp_path, states))[3]
    assert [o for _, _, o in sim.items] == ["as predicted", None]
    assert sim.verdict() == "open: does not hold or holds or inconclusive"   # the open one may be reversed


def test_inspect_a_sweep_draws_the_state_pictures_of_each_variants_best_run(tmp_path):
    """A real (tiny, CPU) sweep with the state-scaling figure's name and variants; `sandbox inspect SWEEP_DIR`
    inspects, per variant and seed, the learning rate with the best accuracy (checked against the runs'
    own result.json), draws pictures for seed 0 only, and `sandbox verdict` then judges the state claims."""
    import json
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
    assert len(claims) == 6 and all(not c.verdict().startswith("open") for c in claims[3:])


def test_a_figures_parts_in_two_directories_pool_to_the_verdicts_of_one_and_repeats_are_refused(tmp_path):
    """Figure 8's part 1 (d128, 3 seeds) and part 2 (d64, d256, seed 0) written into directories of their own
    give the claims' outcomes of both written into one; two directories holding the same grid points (a repeat,
    whose best over both would count as more learning rates) are an error."""
    part1 = pairs([0.9, 0.91, 0.92], [0.3, 0.31, 0.32])
    part2 = {(m, s, d, t, 4): [acc] for m in MIXERS for s in SETTINGS for d, t, acc in
             ((64, True, 0.4), (64, False, 0.1), (256, True, 0.95), (256, False, 0.2))}
    one = verdicts(write(tmp_path / "one", {**part1, **part2}))
    two = verdicts(write(tmp_path / "a", part1), write(tmp_path / "b", part2))
    assert [(c.verdict(), c.items) for c in two] == [(c.verdict(), c.items) for c in one]
    assert one[0].verdict() == "holds" and one[1].verdict() == "holds"
    with pytest.raises(ValueError, match="share 36 grid point"):
        verdicts(write(tmp_path / "c", part1), tmp_path / "a")
