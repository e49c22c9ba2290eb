"""`sandbox verdict`: the fixed criteria of results/README.md computed from a sweep's rows, against outcomes
built into synthetic results by construction."""
import csv
import itertools

import pytest
import yaml

from sandbox.analysis.verdicts import Cell, Table, verdicts

MIXERS = ("gla", "metala", "gsa")
SETTINGS = ((192, 0), (0, 192))
COLS = ["trial", "status", "seed", "model.mixer", "model.d_model", "model.gsa.topk", "model.gla.conv_size",
        "task.gap", "task.noise", "train.lr", "best_accuracy"]


def write(tmp_path, cells):
    """cells: {(mixer, (gap, noise), d_model, topk, conv): [best accuracy per seed]}; each seed gets a second,
    worse learning rate and a failed trial (accuracy 0), which must not count."""
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "sse_fig8_topk", "base": {"task": {"name": "mqar", "num_kv_pairs": 16}}}))
    rows = []
    for (mixer, (gap, noise), d, topk, conv), accs in cells.items():
        for seed, acc in enumerate(accs):
            for lr, a, status in ((2e-3, acc, "complete"), (5e-4, acc / 2, "complete"), (8e-3, 0, "failed")):
                rows.append([len(rows), status, seed, mixer, d, 16 if topk else "", conv, gap, noise, lr, a])
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
    makes it inconclusive, none does not hold (Figure 8 part 1 as of session 10)."""
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
    with pytest.raises(ValueError, match="has no criteria"):
        verdicts(tmp_path)
