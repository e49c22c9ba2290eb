"""Named training recipes: ``train.recipe: NAME`` fills in the settings a published protocol fixes together.

A recipe is a function of the raw run config (its settings may depend on the task, as batch size depends on the
sequence length in Zoology) that returns values for keys the config leaves unset; a key written in the config, or
given with ``--set``, always wins. The recipe's name stays in ``train.recipe`` so every result records it.
"""
from __future__ import annotations

import copy
from typing import Callable

RECIPES: dict[str, Callable[[dict], dict]] = {}


def recipe(name: str):
    def deco(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        RECIPES[name] = fn
        return fn
    return deco


@recipe("zoology")
def zoology(raw: dict) -> dict:
    """Zoology's MQAR recipe (Arora et al. 2023, the paper's configs for Figure 2): a fixed training set of
    100,000 examples seen for 64 epochs, with batch 512 up to sequence length 128, then 256, 128 and 64 as the
    length doubles; AdamW with betas (0.9, 0.999) and weight decay 0.1; cosine decay with no warm-up; dropout
    0.1 on the embeddings and attention weights; fp32; 3,000 test examples. Validation is evaluated once per
    epoch (Zoology evaluates on test; here val chooses, test is read). A batch size set in the config keeps the
    64 epochs: the steps follow it."""
    seq_len = int((raw.get("task") or {}).get("seq_len", 256))
    batch = (raw.get("train") or {}).get("batch_size") or (
        512 if seq_len <= 128 else 256 if seq_len <= 256 else 128 if seq_len <= 512 else 64)
    examples, epochs = 100_000, 64
    return {"task": {"train_examples": examples, "test_examples": 3000, "val_examples": 3000},
            "model": {"dropout": 0.1},
            "train": {"batch_size": batch, "steps": epochs * examples // batch, "eval_every": examples // batch,
                      "betas": [0.9, 0.999], "weight_decay": 0.1, "warmup_frac": 0.0, "precision": "fp32"}}


def recipe_fills(raw: dict) -> dict[str, dict]:
    """The values ``raw``'s recipe fills in, by section: those of the keys ``raw`` leaves unset (none without a
    recipe). Raises ``KeyError`` naming the recipe when it is unknown."""
    name = (raw.get("train") or {}).get("recipe")
    if name is None:
        return {}
    if name not in RECIPES:
        raise KeyError(name)
    return {section: {k: v for k, v in values.items() if k not in (raw.get(section) or {})}
            for section, values in RECIPES[name](raw).items()}


def apply_recipe(raw: dict) -> dict:
    """``raw`` with its recipe's values under every key it leaves unset (a copy; ``raw`` itself is unchanged).
    Raises ``KeyError`` naming the recipe when it is unknown."""
    fills = recipe_fills(raw)
    if not fills:
        return raw
    out = copy.deepcopy(raw)
    for section, values in fills.items():
        out[section] = {**(out.get(section) or {}), **values}
    return out
