"""Named recipes fill the settings a published protocol fixes together; the config's own keys win."""
import pytest
import torch

from sandbox.config import ConfigError, load_config
from sandbox.model import LanguageModel
from sandbox.tasks import make_task

# Zoology's Figure 2 configs: 100,000 training examples, 64 epochs, batch by sequence length
ZOOLOGY = {64: (512, 12_500), 128: (512, 12_500), 256: (256, 25_000), 512: (128, 50_000)}


@pytest.mark.parametrize("seq_len", sorted(ZOOLOGY))
def test_zoology_recipe_matches_the_published_configs(seq_len):
    pairs = {64: 4, 128: 8, 256: 16, 512: 64}[seq_len]
    c = load_config(data={"task": {"name": "mqar", "seq_len": seq_len, "num_kv_pairs": pairs},
                          "train": {"recipe": "zoology"}})
    assert (c.train.batch_size, c.train.steps) == ZOOLOGY[seq_len]
    assert c.train.betas == [0.9, 0.999] and c.train.weight_decay == 0.1 and c.train.warmup_frac == 0.0
    assert c.train.precision == "fp32" and c.model.dropout == 0.1
    assert (c.task.params.train_examples, c.task.params.test_examples) == (100_000, 3000)
    assert c.train.recipe == "zoology"


def test_keys_written_in_the_config_or_set_win_over_the_recipe():
    c = load_config(data={"task": {"name": "mqar", "seq_len": 512, "num_kv_pairs": 64},
                          "train": {"recipe": "zoology", "batch_size": 256}},
                    overrides=["model.dropout=0.0"])
    assert c.train.batch_size == 256 and c.train.steps == 64 * 100_000 // 256   # the epochs follow the batch
    assert c.model.dropout == 0.0


def test_a_sweep_point_gets_the_recipe_of_its_own_sequence_length(tmp_path):
    """The recipe fills each point's settings from the point, not from the sweep's base (seq_len 64 here); a
    key the base writes still wins at every point."""
    from sandbox.sweep.spec import load_sweep
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 64, num_kv_pairs: 4}, model: {mixer: attention}, "
                 "train: {recipe: zoology}}\ngrid: {\"task.seq_len, task.num_kv_pairs\": [[64, 4], [256, 16], [512, 64]]}\n"
                 "objective: {metric: val/accuracy, mode: best}\n")
    got = {c.task.params.seq_len: (c.train.batch_size, c.train.steps)
           for c in map(load_sweep(f).point_config, load_sweep(f).points())}
    assert got == {T: ZOOLOGY[T] for T in (64, 256, 512)}
    f.write_text(f.read_text().replace("recipe: zoology", "recipe: zoology, batch_size: 64"))
    assert {load_sweep(f).point_config(p).train.batch_size for p in load_sweep(f).points()} == {64}


def test_an_unknown_recipe_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"train\.recipe: unknown recipe 'nope' \(known: .*zoology"):
        load_config(data={"task": {"name": "mqar"}, "train": {"recipe": "nope"}})


def test_dropout_acts_in_training_only():
    c = load_config(data={"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64},
                          "model": {"mixer": "attention", "d_model": 32, "dropout": 0.5}})
    task = make_task(c.task.params)
    torch.manual_seed(0)
    model = LanguageModel(c.model, task.vocab_size, task.seq_len)
    x, _ = task.sample(4, "train", 0)
    assert not torch.equal(model(x), model(x))               # a new mask each forward
    model.eval()
    assert torch.equal(model(x), model(x))


def test_written_out_attention_equals_sdpa_without_dropout():
    """The written-out attention (used with dropout, and for stacked replicas under a mask) is softmax attention:
    at p = 0 it equals SDPA."""
    import torch.nn.functional as F
    from sandbox.mixers.attention import softmax_attention, causal_window_mask
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float64) for _ in range(3))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(softmax_attention(q, k, v, None, 0.0), causal)
    mask = causal_window_mask(16, 4, "cpu")
    windowed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(softmax_attention(q, k, v, mask, 0.0), windowed)


def test_a_study_from_before_the_per_point_recipe_trains_its_waiting_trials_with_it(tmp_path):
    """A study stores the base config its sweep resolved, and the workers build every trial from it. A study
    created while the recipe was resolved on the base (batch 512 and 12,500 steps, from seq_len 64) must not
    train its waiting (256, 16) and (512, 64) points that way once the sweep is launched again."""
    import os

    from sandbox.config import to_dict
    from sandbox.sweep.runner import _open_study
    from sandbox.sweep.spec import load_sweep
    from sandbox.sweep.study import enqueue_points, open_storage, prepare_study
    from sandbox.sweep.worker import _Worker
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 64, num_kv_pairs: 4}, model: {mixer: attention}, "
                 "train: {recipe: zoology}}\ngrid: {\"task.seq_len, task.num_kv_pairs\": [[64, 4], [256, 16], [512, 64]]}\n"
                 "objective: {metric: val/accuracy, mode: best}\n")
    out = tmp_path / "out"
    out.mkdir()
    spec = load_sweep(f)
    study = prepare_study(spec, open_storage(out, None))
    old_base = to_dict(load_config(data={"task": {"name": "mqar", "seq_len": 64, "num_kv_pairs": 4},
                                         "model": {"mixer": "attention"}, "train": {"recipe": "zoology"}}))
    old_base["name"] = None
    assert (old_base["train"]["batch_size"], old_base["train"]["steps"]) == (512, 12_500)
    study.set_user_attr("spec", {**study.user_attrs["spec"], "base": old_base})
    enqueue_points(study, spec)

    def steps_by_point(study):
        w = _Worker(out, study, os.getpid(), None, stack=1)
        return sorted(w._kind(t)[2] for t in study.get_trials(deepcopy=False))

    assert steps_by_point(study) == [12_500] * 3           # what the old study would train
    study, _, notes = _open_study(spec, out, None, 10, 60, False, [])
    assert steps_by_point(study) == [ZOOLOGY[T][1] for T in (64, 256, 512)]
    assert any("no longer fixed there: " in n and "train.batch_size" in n for n in notes), notes
    study, _, notes = _open_study(spec, out, None, 10, 60, False, [])   # once only
    assert not any("base config" in n for n in notes), notes
    # a study whose base set another batch than the recipe gives there is another protocol: refused
    other = {**old_base, "train": {**old_base["train"], "batch_size": 256}}
    study.set_user_attr("spec", {**study.user_attrs["spec"], "base": other})
    with pytest.raises(ConfigError, match=r"base\.train\.batch_size: differs from the study 's' .*\(256 there, 512 here\)"):
        _open_study(spec, out, None, 10, 60, False, [])
