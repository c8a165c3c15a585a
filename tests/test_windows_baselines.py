"""Baselines of a problem with a sliding window or a logit softcap, built without a GPU: SDPA gets the window
as a boolean mask (its flash backend, which takes no mask, is not tried), a softcap gets no SDPA baseline at
all, and FlashAttention-4 gets both in its own spelling (an unbounded side is None, not -1)."""

from __future__ import annotations

import sys
import types

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from fa4_fakes import install_fake_fa4

import tuner.runtime.baselines as baselines
from tuner.problem import Problem, window_pairs
from tuner.runtime.baselines import FA4, available_baselines, missing_baselines_note, sdpa_mask
from tuner.runtime.verify import keys_kept, problem_reference


@pytest.fixture
def fake_fa4(monkeypatch):
    """A flash_attn.cute whose flash_attn_func (FA4's keywords: window_size, softcap) records its calls."""
    calls: list[dict] = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
        calls.append(dict(causal=causal, window_size=window_size, softcap=softcap))
        return q, None

    install_fake_fa4(monkeypatch, flash_attn_func)
    return calls


@pytest.fixture
def recorded_sdpa(monkeypatch):
    """SDPA that records the keyword arguments of each call (on a CPU there is no backend to restrict to);
    `real` is torch's own, to run a recorded call."""
    import torch
    import torch.nn.functional as F

    recorded = types.SimpleNamespace(calls=[], real=F.scaled_dot_product_attention)

    def sdpa(q, k, v, **kwargs):
        recorded.calls.append(kwargs)
        return q

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: None)
    return recorded


def _qkv(problem: Problem):
    import torch

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(problem.batch, problem.heads, problem.seq_q, problem.head_dim, generator=gen)
    k = torch.randn(problem.batch, problem.heads_kv, problem.seq_k, problem.head_dim, generator=gen)
    v = torch.randn(problem.batch, problem.heads_kv, problem.seq_k, problem.head_dim, generator=gen)
    return q, k, v


@settings(deadline=None)  # the first example imports torch
@given(st.integers(1, 40), st.integers(1, 40), st.integers(-1, 45), st.integers(-1, 45), st.booleans())
@example(2, 1, -1, -1, False)  # no window, no causality: a mask of one row that broadcasts
def test_the_keys_a_mask_keeps_are_the_pairs_the_flops_count(sq, sk, left, right, causal) -> None:
    """keys_kept (SDPA's mask, the reference's) and window_pairs (Problem.flops) agree on every window."""
    right = -1 if causal else right
    kept = keys_kept(sq, sk, sk, causal, "cpu", (left, right)).expand(sq, sk)  # [1, Sk] when only lengths bound it
    assert int(kept.sum()) == window_pairs(sq, sk, left, 0 if causal else right)


@pytest.mark.parametrize("problem", [
    Problem(1, 4, 24, 40, 16, causal=True, window_left=7),
    Problem(2, 4, 40, 24, 16, heads_kv=2, window_left=5, window_right=3),
    Problem(1, 2, 32, 32, 16, window_left=-1, window_right=4),
], ids=["causal-left", "gqa-left-right", "right-only"])
def test_sdpa_gets_the_window_as_a_mask_and_computes_the_reference(recorded_sdpa, problem) -> None:
    """The mask SDPA is given reproduces the fp32 reference (bottom-right aligned, causality included);
    the flash backend, which takes no mask, is not asked."""
    import torch

    q, k, v = _qkv(problem)
    found = available_baselines(problem, q, k, v, 0.25, fa4=False)
    assert [b.name for b in found] == ["sdpa_cudnn", "sdpa_efficient"]
    kwargs = recorded_sdpa.calls[-1]
    mask = kwargs["attn_mask"]
    assert mask.dtype == torch.bool and tuple(mask.shape) == (1, 1, problem.seq_q, problem.seq_k)
    assert "is_causal" not in kwargs
    out = recorded_sdpa.real(q, k, v, **kwargs)  # the math backend on a CPU
    ref, _ = problem_reference(problem, q, k, v, 0.25)
    assert torch.allclose(out, ref, atol=1e-5)


def test_a_problem_without_window_keeps_the_causal_flag(recorded_sdpa) -> None:
    problem = Problem(1, 2, 16, 16, 16, causal=True)
    assert sdpa_mask(problem, "cpu") is None
    q, k, v = _qkv(problem)
    assert [b.name for b in available_baselines(problem, q, k, v, fa4=False)] == list(baselines.SDPA_BACKENDS)
    assert all(c.get("is_causal") is True and "attn_mask" not in c for c in recorded_sdpa.calls)


def test_a_softcap_problem_has_no_sdpa_baseline_but_fa4_with_the_softcap(fake_fa4, monkeypatch) -> None:
    def never(*_args, **_kwargs):
        raise AssertionError("SDPA cannot softcap: it must not be asked")

    monkeypatch.setattr(baselines, "sdpa_baseline", never)
    problem = Problem(1, 2, 16, 16, 16, causal=True, window_left=4, softcap=30.0)
    q, k, v = _qkv(problem)
    assert [b.name for b in available_baselines(problem, q, k, v)] == [FA4]
    assert fake_fa4[-1] == dict(causal=True, window_size=(4, None), softcap=30.0)
    assert available_baselines(problem, q, k, v, fa4=False) == []


@pytest.mark.parametrize("causal, window, expected", [
    (True, (128, -1), (128, None)),  # FA4 adds the causal right bound 0 itself
    (False, (64, 32), (64, 32)),
    (False, (-1, 32), (None, 32)),  # -1 would be read as a bound of -1 (only (-1, -1) together is none)
    (False, (64, -1), (64, None)),
])
def test_fa4_gets_the_window_with_none_for_an_unbounded_side(fake_fa4, causal, window, expected) -> None:
    problem = Problem(1, 2, 16, 16, 16, causal=causal, window_left=window[0], window_right=window[1])
    q, k, v = _qkv(problem)
    assert baselines.fa4_baseline(q, k, v, causal, None, window) is not None
    assert fake_fa4[-1]["window_size"] == expected and fake_fa4[-1]["causal"] is causal


def test_fa4_is_called_as_before_without_window_or_softcap(monkeypatch) -> None:
    """A plain problem passes neither keyword: an FA4 build without them still serves."""
    calls = []
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = lambda q, k, v, softmax_scale=None, causal=False: calls.append(causal) or (q, None)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    q, k, v = _qkv(Problem(1, 2, 16, 16, 16))
    assert baselines.fa4_baseline(q, k, v, True) is not None and calls == [True]


def test_the_gpu_worker_passes_the_problem_s_window_and_softcap_to_fa4(fake_fa4, monkeypatch) -> None:
    from tuner.backends.gpu_child import CudaRunner, RunnerOptions
    from tuner.runtime.timing import Timing

    problem = Problem(1, 2, 16, 16, 16, window_left=8, window_right=2, softcap=50.0)
    q, k, v = _qkv(problem)
    runner = CudaRunner(RunnerOptions())
    monkeypatch.setattr(runner, "_problem_inputs", lambda _problem: {"q": q, "k": k, "v": v, "scale": 0.25, "seed": 1})
    def time_once(fn, **_kwargs) -> Timing:
        fn()
        return Timing(9.0, 8.0, 10.0, 10)

    monkeypatch.setattr(baselines, "time_call", time_once)
    rows = runner.baselines(problem, "", lambda *a, **kw: None)
    assert [r["impl"] for r in rows] == [FA4]
    assert fake_fa4[-1] == dict(causal=False, window_size=(8, 2), softcap=50.0)


def test_the_missing_baselines_are_named_with_the_reason() -> None:
    assert missing_baselines_note(Problem(1, 2, 16, 16, 16, causal=True)) is None
    window = missing_baselines_note(Problem(1, 2, 16, 16, 16, causal=True, window_left=4))
    assert window is not None and window.startswith("no sdpa_flash baseline: ") and "mask" in window
    assert missing_baselines_note(Problem(1, 2, 16, 16, 16, window_left=4, softcap=30.0)) == \
        "no SDPA baseline: SDPA has no logit softcapping"
