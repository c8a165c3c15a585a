"""The baselines' construction without a GPU: FlashAttention-4 joins the SDPA backends where it imports and
takes the problem, in its own [B, S, H, D] layout, and is left out where it does not or is not wanted."""

from __future__ import annotations

import sys
import warnings

import pytest
from fa4_fakes import install_fake_fa4, unset_fa4_cache_settings

from tuner.problem import Problem
from tuner.runtime.baseline_log import log_path, take_counts
from tuner.runtime.baselines import FA4, FA4_CACHE_DIR_ENV, FA4_CACHE_ENABLED_ENV, available_baselines, fa4_baseline


@pytest.fixture
def fake_fa4(monkeypatch):
    """A flash_attn.cute whose flash_attn_func records its calls (or raises, when told to)."""
    calls: list[dict] = []
    state = {"raise": False}

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        if state["raise"]:
            raise ValueError("head dim not supported")
        calls.append(dict(q=q, k=k, v=v, scale=softmax_scale, causal=causal))
        return q, None

    install_fake_fa4(monkeypatch, flash_attn_func)
    return calls, state


def _qkv():
    import torch

    q = torch.randn(2, 8, 5, 64)
    k, v = torch.randn(2, 2, 7, 64), torch.randn(2, 2, 7, 64)
    return q, k, v


def test_fa4_runs_on_contiguous_bshd_copies_with_causal_and_scale(fake_fa4) -> None:
    calls, _ = fake_fa4
    q, k, v = _qkv()
    baseline = fa4_baseline(q, k, v, True, 0.125)
    assert baseline is not None and baseline.name == FA4 and baseline.backend is None
    with baseline.restrict():  # no SDPA backend to restrict: a no-op context
        baseline.call()
    last = calls[-1]
    assert tuple(last["q"].shape) == (2, 5, 8, 64) and last["q"].is_contiguous()
    assert tuple(last["k"].shape) == (2, 7, 2, 64) and last["causal"] is True and last["scale"] == 0.125
    assert (last["q"].transpose(1, 2) == q).all()


def test_fa4_is_no_baseline_where_it_rejects_the_problem_or_is_not_installed(fake_fa4, monkeypatch) -> None:
    _, state = fake_fa4
    q, k, v = _qkv()
    state["raise"] = True
    assert fa4_baseline(q, k, v, False) is None
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import fails
    assert fa4_baseline(q, k, v, False) is None


def test_fa4_can_be_left_out(fake_fa4, monkeypatch) -> None:
    """export --check asks for SDPA only (its fallback is SDPA); searches and benchmarks take FA4 too."""
    import tuner.runtime.baselines as baselines

    def no_sdpa(name, *args, **kwargs):
        raise RuntimeError("no SDPA backend on a CPU test")

    monkeypatch.setattr(baselines, "sdpa_baseline", no_sdpa)
    q, k, v = _qkv()
    problem = Problem(2, 8, 5, 7, 64, heads_kv=2)
    assert [b.name for b in available_baselines(problem, q, k, v)] == [FA4]
    assert available_baselines(problem, q, k, v, fa4=False) == []


# --- its compile cache and its warnings --------------------------------------------------------

FAKE_CUTE = '''
import os
import warnings

# As flash_attn/cute/cache_utils.py: the persistent compile cache is configured when the package is imported.
CACHE = (os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"), os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"))
warnings.warn("cutlass DSL import note " + "x" * 300, UserWarning)
compiled = set()


def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
    if tuple(q.shape) not in compiled:  # its JIT compiler speaks up on a new shape
        warnings.warn("JIT compile note " + "y" * 300, UserWarning)
        compiled.add(tuple(q.shape))
    return q, None
'''


@pytest.fixture
def fa4_package(tmp_path, monkeypatch):
    """An importable flash_attn.cute that reads the cache settings at import and warns as FA4's compiler does;
    the environment it sees is the test's (both variables unset unless a test sets them)."""
    root = tmp_path / "site"
    (root / "flash_attn" / "cute").mkdir(parents=True)
    (root / "flash_attn" / "__init__.py").write_text("")
    (root / "flash_attn" / "cute" / "__init__.py").write_text(FAKE_CUTE)
    monkeypatch.syspath_prepend(str(root))
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    unset_fa4_cache_settings(monkeypatch)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_LOG_DIR", str(tmp_path / "log"))
    yield tmp_path
    for name in ("flash_attn.cute", "flash_attn"):
        sys.modules.pop(name, None)


def test_fa4_is_imported_with_its_compile_cache_on_in_ours(fa4_package) -> None:
    q, k, v = _qkv()
    assert fa4_baseline(q, k, v, False) is not None
    assert sys.modules["flash_attn.cute"].CACHE == ("1", str(fa4_package / "cache" / "fa4"))


def test_the_users_fa4_cache_settings_stand(fa4_package, monkeypatch) -> None:
    monkeypatch.setenv(FA4_CACHE_ENABLED_ENV, "0")
    monkeypatch.setenv(FA4_CACHE_DIR_ENV, "/elsewhere")
    q, k, v = _qkv()
    assert fa4_baseline(q, k, v, False) is not None
    assert sys.modules["flash_attn.cute"].CACHE == ("0", "/elsewhere")


def test_fa4_warnings_go_to_the_log_not_the_output(fa4_package, capfd) -> None:
    q, k, v = _qkv()
    take_counts()
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        baseline = fa4_baseline(q, k, v, True)
    assert baseline is not None and escaped == []
    assert capfd.readouterr().err == ""
    log = log_path().read_text()
    assert log_path() == fa4_package / "log" / "baselines.log"
    assert "fa4 (import): UserWarning: cutlass DSL import note " + "x" * 300 in log
    assert "fa4 (compile and first call): UserWarning: JIT compile note " + "y" * 300 in log
    assert take_counts() == {FA4: 2}


def test_the_gpu_worker_reports_how_many_warnings_each_baseline_logged(fa4_package, monkeypatch) -> None:
    """CudaRunner.baselines on a CPU (inputs and timing stand-ins): FA4's two warnings are counted on its row."""
    import tuner.runtime.baselines as baselines
    from tuner.backends.gpu_child import CudaRunner, RunnerOptions
    from tuner.runtime.timing import Timing

    q, k, v = _qkv()
    runner = CudaRunner(RunnerOptions())
    monkeypatch.setattr(runner, "_problem_inputs", lambda problem: {"q": q, "k": k, "v": v, "scale": 0.125, "seed": 1})
    def no_sdpa(*_args, **_kwargs):
        raise RuntimeError("no SDPA backend on a CPU test")

    def time_once(fn, **_kwargs) -> Timing:
        fn()
        return Timing(9.0, 8.0, 10.0, 10)

    monkeypatch.setattr(baselines, "sdpa_baseline", no_sdpa)
    monkeypatch.setattr(baselines, "time_call", time_once)
    rows = runner.baselines(Problem(2, 8, 5, 7, 64, heads_kv=2), "", lambda *a, **kw: None)
    assert rows == [{"impl": FA4, "timing": Timing(9.0, 8.0, 10.0, 10), "warnings": 2}]
