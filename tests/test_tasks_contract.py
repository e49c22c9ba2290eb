"""The task contract (``sandbox.tasks.base``): registry, members, and MQAR's chance level."""
import dataclasses

import pytest
import torch

from sandbox.tasks import Task, make_task, register_task, task_config_class, task_names


# small parameters of each registered task, so that its held-out splits are drawn in a moment on a CPU
SMALL = {"mqar": dict(seq_len=32, num_kv_pairs=4, vocab_size=64, noise=8)}


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_keeps_the_contract(name):
    assert name in SMALL, f"give the task {name!r} small parameters in SMALL"
    task = make_task(name, seed=1, **SMALL[name])
    assert isinstance(task, Task) and task.name == name
    assert isinstance(task.seq_len, int) and isinstance(task.vocab_size, int)
    assert 0 < task.chance < 1
    assert task.rows_per_call >= 1 and (task.max_targets is None or task.max_targets >= 1)
    assert set(task.split_sizes) == {"val", "test"} and min(task.split_sizes.values()) >= 1
    for split in ("train", "val", "test"):
        x, y = task.sample(3, split, 0)
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, task.seq_len)
        assert x.device == task.device and 0 <= int(x.min()) and int(x.max()) < task.vocab_size
        assert ((y == -100) | (y >= 0)).all()
        if task.max_targets is not None:
            assert int((y != -100).sum(1).max()) <= task.max_targets
    # the whole held-out split, in batches that need not divide it
    for split in ("val", "test"):
        rows = torch.cat([x for x, _ in task.eval_batches(split, 100)])
        assert rows.shape[0] == task.split_sizes[split]
        assert torch.equal(rows[:3], task.sample(3, split, 0)[0])


def test_registry_refuses_a_second_name_and_a_plain_config():
    with pytest.raises(ValueError, match="registered twice"):
        register_task("mqar", task_config_class("mqar"))(type("Again", (Task,), {}))
    with pytest.raises(TypeError, match="dataclass"):
        register_task("plain", dict)


def test_make_task_from_a_name_or_a_config_gives_the_same_task():
    params = dict(seq_len=40, num_kv_pairs=4, vocab_size=64, noise=8)
    a = make_task("mqar", seed=2, **params)
    b = make_task(task_config_class("mqar")(**params), seed=2)
    assert torch.equal(a.sample(5, "train", 3)[0], b.sample(5, "train", 3)[0])
    with pytest.raises(ValueError, match=r"^task\.num_pairs: not a parameter of 'mqar'"):
        make_task("mqar", num_pairs=3)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope")

    @dataclasses.dataclass
    class Stray:
        n: int = 1
    with pytest.raises(TypeError, match="Stray is the config of no registered task"):
        make_task(Stray())


def test_mqar_chance_is_a_uniform_guess_among_the_context_values():
    """``chance`` against a simulated guesser that answers every query with a value of its row's context picked
    uniformly (what a model that never binds a key to its value can do): 1 / num_kv_pairs."""
    kv = 4
    task = make_task("mqar", seq_len=48, num_kv_pairs=kv, vocab_size=256, seed=0, test_examples=2048)
    gen = torch.Generator().manual_seed(0)
    correct = scored = 0
    for x, y in task.eval_batches("test", 512):
        values = x[:, 1:2 * kv:2]                                         # the context's values
        for row in range(x.shape[0]):
            targets = y[row][y[row] != -100]
            guesses = values[row][torch.randint(kv, (targets.numel(),), generator=gen)]
            correct += int((guesses == targets).sum())
            scored += targets.numel()
    # 8192 guesses: the sd of the hit rate is sqrt(p(1-p)/8192) = 0.005
    assert abs(correct / scored - task.chance) < 0.02
    assert task.chance == 1 / kv
