"""Bad input through the real CLI: one line on stderr naming file and key, exit status 2."""
import pytest

from sandbox.cli import main

GOOD = """task: {name: mqar, seq_len: 64, num_kv_pairs: 4, vocab_size: 64}
model: {mixer: attention, d_model: 32}
train: {steps: 2}
"""

CASES = [
    ("unknown key", GOOD.replace("d_model: 32", "d_modle: 32"), [], "model.d_modle"),
    ("wrong type", GOOD.replace("d_model: 32", "d_model: big"), [], "model.d_model"),
    ("seq too short", GOOD.replace("seq_len: 64", "seq_len: 10"), [], "task.seq_len"),
    ("vocab too small", GOOD.replace("vocab_size: 64", "vocab_size: 8"), [], "task.vocab_size"),
    ("gap too long", GOOD.replace("vocab_size: 64", "vocab_size: 64, gap: 60"), [], "task.seq_len"),
    ("malformed yaml", "task: {name: mqar\nmodel: [", [], "malformed YAML"),
    ("unknown mixer", GOOD.replace("mixer: attention", "mixer: transformerz"), [], "model.mixer"),
    ("heads do not divide", GOOD.replace("d_model: 32", "d_model: 32, n_heads: 3"), [], "model.n_heads"),
    ("bad --set", GOOD, ["--set", "model.d_model"], "--set"),
    ("--set unknown key", GOOD, ["--set", "train.lrate=0.1"], "train.lrate"),
    ("missing task", "model: {d_model: 32}\n", [], "task"),
    ("gap and noise", GOOD.replace("vocab_size: 64", "vocab_size: 64, gap: 2, noise: 2"), [], "task.noise"),
    ("negative lr", GOOD.replace("steps: 2", "steps: 2, lr: -1"), [], "train.lr"),
    ("pattern does not tile", GOOD.replace("mixer: attention", "mixer: [attention, attention, attention]"),
     [], "model.mixer"),
    ("mixer option typo", GOOD.replace("d_model: 32", "d_model: 32, attention: {windw: 4}"), [],
     "model.attention.windw"),
]


@pytest.mark.parametrize("name,text,extra,key", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_one_clean_line(tmp_path, capsys, name, text, extra, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert key in err
    assert str(path) in err or "--set" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "result.json").exists()


def test_missing_file(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
