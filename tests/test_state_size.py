"""Every figure's x-axis state size is the state its model carries, counted from what the model captures.

A figure plots ``state_size``, which training records as ``model.state_size(seq_len)``, the sum of the
mixers' ``state_size``. Here a mixer's state is counted from the tensors its forward records under the
capture hook (``Mixer.capture``), by rules written independently of the mixers' formulas. The state is
what a mixer carries, after the last token, to continue the sequence:

* a recurrent mixer: its final state (GSA also its key state), the normaliser where it normalises, and
  each short convolution's last ``conv_size - 1`` inputs per channel;
* attention: the keys and values of every position; a window: those its last query sees (the sinks and
  the last ``window`` positions);
* MoBA: every position's keys and values, since a later query may choose any block;
* NSA: every position for its selected branch, the compressed blocks, the raw keys and values from the
  next compressed block's start on (that block is not complete yet), and its window;
* LTE: what its inference cache holds (sinks, retained tokens up to its cap, the window). ``state_size``
  is that cache's capacity, which a model reaches when it retains at least ``cap`` tokens.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from sandbox.config import read_yaml, to_dict
from sandbox.mixers import MixerContext, build_mixer, mixer_config_class, mixer_names
from sandbox.mixers.base import _REGISTRY
from sandbox.mixers.linear import LinearMixer
from sandbox.mixers.lte import LearnableTokenEviction, use_cache
from sandbox.model import LanguageModel
from sandbox.sweep.spec import build_config

FIGURES = Path(__file__).resolve().parents[1] / "figures"
SWEEPS = sorted(FIGURES.glob("*/*.yaml"))
# Figure models with key/value caches run on sequences of at most this length: longer than every figure's window +
# sinks + cap, block and compressed block, so every part of every cache is filled (a full length costs minutes on a
# CPU). A recurrent state does not grow with the sequence: those models run on SHORT_T tokens, more than a short
# convolution carries.
MAX_T = 96
SHORT_T = 8
LINEAR = sorted(n for n in mixer_names() if issubclass(_REGISTRY[n][0], LinearMixer))
KV_CACHES = {"attention", "swa", "lte", "moba", "nsa"}      # mixers whose state grows with the sequence
NSA_CACHE = ("keys", "values", "cmp_keys", "cmp_values", "cmp_tail_keys", "cmp_tail_values",
             "window_keys", "window_values")


def state_parts(name: str, opts) -> list[str]:
    """The captured tensors that make up the state of mixer ``name`` with options ``opts``."""
    if name == "attention":
        return ["keys", "values"] if opts.window is None else ["cache_keys", "cache_values"]
    if name == "moba":
        return ["keys", "values"]
    if name == "swa":
        return ["cache_keys", "cache_values"]
    if name == "nsa":
        return list(NSA_CACHE)
    parts = ["final_state"] + (["final_key_state"] if name == "gsa" else [])
    if getattr(opts, "normalize", False):
        parts.append("final_normalizer")
    if getattr(opts, "conv_size", 0) > 0:
        parts.append("conv_state")
        if name == "sse" and not opts.shared_params and opts.n > 1:
            parts.append("part_conv_state")
    return parts


def held(name: str, opts, captured: dict) -> int:
    """Elements of the state that the sequences of ``captured`` carry, all together."""
    if name == "lte":     # slots of the fixed-size cache that hold a token, keys and values
        valid = captured["cache_valid"]
        return int(valid.sum()) * (captured["cache_keys"].shape[-1] + captured["cache_values"].shape[-1])
    missing = [p for p in state_parts(name, opts) if p not in captured]
    assert not missing, f"mixer {name} does not capture {missing}"
    return sum(captured[p].numel() for p in state_parts(name, opts))


# ---- the figures' models --------------------------------------------------------------------------------------

def figure_configs(path: Path) -> list:
    """One run config per distinct model structure (layer mixers and their options) of a sweep file's grid: the
    smallest the figure plots. The widths only scale what the tests further down check at several sizes."""
    raw = read_yaml(path)
    axes = []
    for key, values in raw["grid"].items():
        keys = [k.strip() for k in key.split(",")]
        rows = [[v] for v in values] if len(keys) == 1 else values
        axes.append([dict(zip(keys, row)) for row in rows])
    distinct = {}
    for combo in itertools.product(*axes):
        values = {k: v for point in combo for k, v in point.items() if k.startswith("model.") or k == "task.seq_len"}
        distinct.setdefault(json.dumps(values, sort_keys=True), values)
    smallest = {}
    for values in distinct.values():
        cfg = build_config(raw["base"], values, str(path))
        names = cfg.model.layer_mixers()
        structure = json.dumps([names, [to_dict(cfg.model.options(n)) for n in names]], sort_keys=True)
        size = (cfg.model.d_model, cfg.task.params.seq_len)
        if structure not in smallest or size < smallest[structure][0]:
            smallest[structure] = (size, cfg)
    return [cfg for _, cfg in smallest.values()]


@pytest.mark.parametrize("path", SWEEPS, ids=[str(p.relative_to(FIGURES)) for p in SWEEPS])
def test_figure_state_size_is_the_captured_state(path):
    """For every model a figure plots: ``model.state_size(T)`` equals the layers' states counted from a forward
    with capture on (that capturing changes no output, the tests below check for each mixer that captures what it
    carries). LTE layers score every token above 0.5 so that their caps bind. Models without key/value caches are
    checked at the figure's own sequence length, the x-axis value, too."""
    for cfg in figure_configs(path):
        task, names = cfg.task.params, cfg.model.layer_mixers()
        T = min(task.seq_len, MAX_T if KV_CACHES & set(names) else SHORT_T)
        torch.manual_seed(0)
        model = LanguageModel(cfg.model, task.vocab_size, task.seq_len).eval()
        for m in model.mixers:
            m.capture = {}
            if isinstance(m, LearnableTokenEviction):
                torch.nn.init.zeros_(m.cnn.head.weight)         # score sigmoid(0.5) for every token: all retained
        x = torch.randint(0, task.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
        with torch.no_grad(), use_cache(model):
            model(x)
        counted = sum(held(n, cfg.model.options(n), m.capture) for n, m in zip(names, model.mixers))
        where = f"{path.name}: {names} d_model={cfg.model.d_model} n_heads={cfg.model.n_heads} T={T}"
        assert model.state_size(T) == counted, where
        if T == task.seq_len or not KV_CACHES & set(names):     # a recurrent state does not grow with the sequence
            assert model.state_size(task.seq_len) == counted, f"{where}: the x-axis value at T={task.seq_len}"


# ---- what the captured states hold ----------------------------------------------------------------------------

def make(name, d=16, h=2, **options):
    torch.manual_seed(0)
    m = build_mixer(name, MixerContext(d, h, 0, 256), mixer_config_class(name)(**options)).double()
    return m.eval()


def run(m, x) -> dict:
    """Capture a forward of ``x`` and check that capturing changed nothing."""
    with torch.no_grad():
        plain = m(x)
        m.capture = {}
        out = m(x)
    captured, m.capture = m.capture, None
    assert torch.equal(plain, out), "capturing changed the output"
    return captured


def last_inputs(z: torch.Tensor, n: int) -> torch.Tensor:
    """The last ``n`` rows of ``z [B, T, C]``, zero rows first where ``T < n``."""
    rows = z[:, max(0, z.shape[1] - n):]
    return torch.cat([z.new_zeros(z.shape[0], n - rows.shape[1], z.shape[2]), rows], 1)


@pytest.mark.parametrize("conv_size", [0, 4])
@pytest.mark.parametrize("topk", [None, 3])
@pytest.mark.parametrize("name", LINEAR)
def test_linear_state_is_the_final_state_and_the_last_projected_inputs(name, topk, conv_size):
    """Every linear-family mixer, dense and row-sparse: its state is the final state (with GSA's key state and a
    normaliser where it has them) and, with a short convolution of size 4, the convolution's last 3 inputs, the q,
    k (where the mixer projects keys) and v projections of the last 3 tokens, zeros before the sequence."""
    m = make(name, topk=topk, conv_size=conv_size, **({"num_slots": 6} if name == "gsa" else {}))
    for T in (2, 9):
        x = torch.randn(2, T, 16, dtype=torch.float64)
        c = run(m, x)
        if conv_size:
            projections = [p for p in (m.q_proj, m.k_proj, m.v_proj) if p is not None]
            expected = last_inputs(torch.cat([p(x) for p in projections], -1), 3)
            torch.testing.assert_close(c["conv_state"], expected, rtol=0, atol=1e-12)
        assert m.state_size(T) == held(name, m.cfg, c) // 2, T


@pytest.mark.parametrize("shared_params", [True, False])
def test_sse_state_counts_its_convolutions(shared_params):
    """SSE with conv_size 4 carries its partitions' states and the last 3 inputs of the core's convolution (q, k, v
    of partition 0) and, with own projections per partition, of theirs."""
    m = make("sse", n=3, k=1, conv_size=4, shared_params=shared_params)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    c = run(m, x)
    core = m.core
    own = torch.cat([p(x) for p in (core.q_proj, core.k_proj, core.v_proj)], -1)
    torch.testing.assert_close(c["conv_state"], last_inputs(own, 3), rtol=0, atol=1e-12)
    if not shared_params:
        torch.testing.assert_close(c["part_conv_state"], last_inputs(m.part_qkv(x), 3), rtol=0, atol=1e-12)
    assert c["final_state"].shape == (2, 2, 4 * core.K, core.V)          # 3 routed partitions + the shared one
    assert m.state_size(7) == held("sse", m.cfg, c) // 2


@pytest.mark.parametrize("T", [3, 6, 12])
def test_windows_keep_the_sinks_and_the_last_positions(T):
    """SWA (window 5, sinks 2) keeps the sinks and the last 5 positions; attention with window 5 the last 5."""
    x = torch.randn(2, T, 16, dtype=torch.float64)
    for name, options, sinks in (("swa", {"window": 5, "sinks": 2, "rope": False}, 2),
                                 ("attention", {"window": 5}, 0)):
        m = make(name, **options)
        c = run(m, x)
        kept = sorted(set(range(min(sinks, T))) | set(range(max(0, T - 5), T)))
        assert torch.equal(c["cache_keys"], c["keys"][:, kept])
        assert torch.equal(c["cache_values"], c["values"][:, kept])
        assert m.state_size(T) == held(name, m.cfg, c) // 2 == 2 * len(kept) * 16


@pytest.mark.parametrize("T", [5, 37, 48])
def test_nsa_keeps_blocks_tail_and_window(T):
    """NSA (compressed blocks of 8 every 4, window 6): every position's selected-branch keys, one compressed key
    per complete block, the raw keys from the next block's start on, and the window's last 6 positions."""
    m = make("nsa", cmp_block=8, cmp_stride=4, slc_block=8, slc_count=3, window=6, rope=False)
    x = torch.randn(2, T, 16, dtype=torch.float64)
    c = run(m, x)
    _, kc, vc, _, _, kw, vw = m.qkv(x).view(2, T, 7, 2, 8).unbind(2)
    starts = [s for s in range(0, T, 4) if s + 8 <= T]
    tail = starts[-1] + 4 if starts else 0
    assert c["cmp_keys"].shape[1] == c["cmp_values"].shape[1] == len(starts)
    assert c["keys"].shape[1] == c["values"].shape[1] == T
    for got, z, first in (("cmp_tail_keys", kc, tail), ("cmp_tail_values", vc, tail),
                          ("window_keys", kw, max(0, T - 6)), ("window_values", vw, max(0, T - 6))):
        torch.testing.assert_close(c[got], z[:, first:], rtol=0, atol=1e-12, msg=lambda s: f"{got}: {s}")
    assert m.state_size(T) == held("nsa", m.cfg, c) // 2


def cached_positions(c: dict, keys: torch.Tensor, b: int, h: int) -> list[int]:
    """Positions of the tokens the LTE cache holds for sequence b, head h (matched by their keys)."""
    slots = c["cache_keys"][b, h][c["cache_valid"][b, h]]
    same = (slots[:, None] == keys[b, None, :, h]).all(-1)           # [slots, T]
    assert (same.sum(1) == 1).all(), "the cache holds a key no token has, or one twice"
    return sorted(same.nonzero()[:, 1].tolist())


@pytest.mark.parametrize("T", [10, 17, 40])
def test_lte_cache_holds_sinks_cap_and_window(T):
    """LTE (window 13, sinks 2, cap 3) scoring every token above 0.5: its cache holds the sinks, the first 3 tokens
    to leave the window past them (the cap binds; equal scores never displace one another) and the last 13; as
    many elements as ``state_size``. Scoring every token below 0.5 it holds only sinks and window."""
    m = make("lte", window=13, sinks=2, cap=3, rope=False)
    x = torch.randn(2, T, 16, dtype=torch.float64)
    _, k, _ = m.project(x)
    torch.nn.init.zeros_(m.cnn.head.weight)                      # every token scores sigmoid(bias)
    for bias, cap in ((0.5, 3), (-0.5, 0)):
        torch.nn.init.constant_(m.cnn.head.bias, bias)
        with use_cache(m):
            c = run(m, x)
        window = set(range(max(0, T - 13), T))
        retained = set(range(2, min(2 + cap, max(2, T - 13))))        # past the sinks, out of the window
        expected = sorted(set(range(min(2, T))) | retained | window)
        for b, h in itertools.product(range(2), range(2)):
            assert cached_positions(c, k, b, h) == expected, (bias, b, h)
        count = held("lte", m.cfg, c) // 2
        assert count == 2 * len(expected) * 16
        assert count == m.state_size(T) if cap else count <= m.state_size(T)
