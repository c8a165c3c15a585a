"""An e4m3 problem in the GPU worker, without a GPU: its inputs keep their descales, the kernel gets them
(and a 16-bit problem's kernel is called as before), the reference and the baselines run on the real
values, SDPA and FA4 in bf16."""

from __future__ import annotations

import types

import pytest
from fa4_fakes import install_fake_fa4

torch = pytest.importorskip("torch")

import tuner.runtime.baselines as baselines  # noqa: E402
from tuner.backends import gpu_child  # noqa: E402
from tuner.backends.gpu_child import CudaRunner, RunnerOptions, kernel_call  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from tuner.runtime.baselines import (  # noqa: E402
    FA4,
    SDPA_BACKENDS,
    Baseline,
    available_baselines,
    missing_baselines_note,
)
from tuner.runtime.timing import Timing  # noqa: E402
from tuner.runtime.verify import Descales, dequantized_inputs, expected_output, fp8_inputs  # noqa: E402

FP8 = Problem(2, 8, 32, 48, 64, dtype="e4m3", heads_kv=2, layout="bshd")


class RecordingKernel:
    """Records each launch as (kind, args, kwargs); takes descales only as the FP8 launcher will."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __call__(self, *args, **kwargs):
        self.calls.append(("checked", args, kwargs))

    def launch_unchecked(self, *args):
        self.calls.append(("unchecked", args, {}))


class SixteenBitKernel:
    """Today's launcher: no descales keyword or argument (a call with them would be a TypeError)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, q, k, v, out, lse, scale, seq_lens=None):
        self.calls.append("checked")

    def launch_unchecked(self, q, k, v, out, lse, scale, seq_lens):
        self.calls.append("unchecked")


@pytest.fixture
def runner(monkeypatch) -> CudaRunner:
    """A CudaRunner whose inputs are made on the CPU."""
    monkeypatch.setattr(gpu_child, "fp8_inputs", lambda problem, _device, seed: fp8_inputs(problem, "cpu", seed))
    return CudaRunner(RunnerOptions(seed=3))


def test_an_fp8_problem_s_inputs_keep_their_descales_and_its_reference_the_real_values(runner) -> None:
    entry = runner._problem_inputs(FP8)
    q, k, v, descales = entry["q"], entry["k"], entry["v"], entry["descales"]
    assert isinstance(descales, Descales) and q.dtype == torch.float8_e4m3fn
    assert [tuple(d.shape) for d in descales] == [(2, 2)] * 3
    again = fp8_inputs(FP8, "cpu", entry["seed"])  # the seed stored with the trial redraws them
    assert all(torch.equal(a.float(), b.float()) for a, b in zip((q, k, v, *descales), (*again[:3], *again[3])))
    want = expected_output(FP8, q, k, v, entry["scale"], descales=descales)
    assert torch.equal(entry["ref"].out, want.out)
    assert runner._problem_inputs(FP8) is entry  # built once per problem


def test_the_kernel_gets_the_descales_on_both_launches() -> None:
    q, k, v, descales = fp8_inputs(FP8, "cpu", seed=1)
    kernel, out = RecordingKernel(), object()
    data = {"q": q, "k": k, "v": v, "scale": 0.125, "descales": descales}
    kernel_call(kernel, data, out, checked=True)()
    kernel_call(kernel, data, out, checked=False)()
    (kind1, args1, kwargs1), (kind2, args2, _) = kernel.calls
    assert kind1 == "checked" and args1 == (q, k, v, out, None, 0.125)
    assert kwargs1 == {"seq_lens": None, "descales": descales}
    assert kind2 == "unchecked" and args2 == (q, k, v, out, None, 0.125, None, descales)
    assert kwargs1["descales"] == (descales.q, descales.k, descales.v)  # the launcher's (q, k, v) tuple


def test_a_16_bit_problem_s_kernel_is_called_as_before() -> None:
    kernel = SixteenBitKernel()
    data = {"q": 1, "k": 2, "v": 3, "scale": 0.125}
    kernel_call(kernel, data, None, checked=True)()
    kernel_call(kernel, data, None, checked=False)()
    assert kernel.calls == ["checked", "unchecked"]


def test_a_paged_fp8_cache_launch_takes_its_scales() -> None:
    """An FP8 KV cache in pages: the paged launch gets (None, k_scale, v_scale), checked or not."""
    kernel = RecordingKernel()
    kernel.paged = lambda *args, **kwargs: kernel.calls.append(("paged", args, kwargs))
    data = {"q": 1, "k": 2, "v": 3, "scale": 1.0, "block_table": 4, "k_cache": 5, "v_cache": 6, "seq_lens": 7,
            "descales": Descales(None, 8, 9)}
    for checked in (True, False):
        kernel_call(kernel, data, "out", checked)()
    assert kernel.calls == [("paged", (1, 5, 6, "out", 4, 7, 1.0), {"check": c, "descales": Descales(None, 8, 9)})
                            for c in (True, False)]


FP8_CACHE = Problem(2, 8, 1, 300, 128, dtype="bf16_kv_e4m3", heads_kv=2)


def test_an_fp8_cache_problem_s_inputs_are_16_bit_queries_and_e4m3_k_and_v_with_scales(runner) -> None:
    entry = runner._problem_inputs(FP8_CACHE)
    q, k, v, descales = entry["q"], entry["k"], entry["v"], entry["descales"]
    assert q.dtype == torch.bfloat16 and k.dtype == v.dtype == torch.float8_e4m3fn
    assert descales.q is None and [tuple(d.shape) for d in descales[1:]] == [(2, 2)] * 2
    real_k = k.float() * descales.k[:, :, None, None]
    want = expected_output(FP8_CACHE, q.float(), real_k, v.float() * descales.v[:, :, None, None], entry["scale"],
                           descales=Descales(None, torch.ones(2, 2), torch.ones(2, 2)))
    assert torch.allclose(entry["ref"].out, want.out)


@pytest.fixture
def recorded(monkeypatch):
    """SDPA (CPU: no backend to restrict to) and FA4 stand-ins that record the tensors they were given."""
    import torch.nn.functional as F

    seen = types.SimpleNamespace(sdpa=[], fa4=[])

    def sdpa(q, k, v, **kwargs):
        seen.sdpa.append((q, k, v))
        return q

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        seen.fa4.append((q, k, v))
        return q, None

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: None)
    install_fake_fa4(monkeypatch, flash_attn_func)
    return seen


def test_sdpa_and_fa4_run_an_fp8_problem_in_bf16_on_its_real_values(recorded) -> None:
    q, k, v, descales = fp8_inputs(FP8, "cpu", seed=2)
    found = available_baselines(FP8, q, k, v, 0.125, descales=descales)
    assert [b.name for b in found] == [*SDPA_BACKENDS, FA4]  # named as for a 16-bit problem
    real = dequantized_inputs(q, k, v, descales)
    for given in recorded.sdpa:
        assert all(t.dtype == torch.bfloat16 for t in given)
        assert all(torch.allclose(t.float(), r, rtol=2**-8, atol=0) for t, r in zip(given, real))
        assert given[0].stride() == q.stride()  # BSHD stays BSHD
    qb = recorded.fa4[-1][0]  # FA4 takes [B, S, H, D]
    assert qb.dtype == torch.bfloat16 and torch.allclose(qb.float(), real[0].transpose(1, 2), rtol=2**-8, atol=0)
    with pytest.raises(TunerError, match=r"^the baselines of a problem in e4m3 need the scales of its FP8 inputs"):
        available_baselines(FP8, q, k, v, 0.125)


def test_native_fp8_baselines_plug_in_after_the_bf16_ones(recorded, monkeypatch) -> None:
    q, k, v, descales = fp8_inputs(FP8, "cpu", seed=2)
    asked = []

    def cudnn_fp8(problem, *args):
        asked.append(args)
        return [Baseline("cudnn_fp8", lambda: None, None)]

    monkeypatch.setattr(baselines, "fp8_baselines", cudnn_fp8)
    assert [b.name for b in available_baselines(FP8, q, k, v, 0.125, descales=descales)][-2:] == [FA4, "cudnn_fp8"]
    assert asked == [(q, k, v, 0.125, descales)]  # the fp8 tensors themselves
    assert [b.name for b in available_baselines(Problem(1, 2, 8, 8, 64), *(t.float() for t in (q[:1, :2, :8],
                                                k[:1, :2, :8], v[:1, :2, :8])), fa4=False)] == list(SDPA_BACKENDS)
    assert len(asked) == 1  # a 16-bit problem has none


def test_the_worker_times_an_fp8_problem_s_baselines_on_its_real_values(runner, recorded, monkeypatch) -> None:
    def time_once(fn, **_kwargs) -> Timing:
        fn()
        return Timing(9.0, 8.0, 10.0, 10)

    monkeypatch.setattr(baselines, "time_call", time_once)
    rows = runner.baselines(FP8, "", lambda *a, **kw: None)
    assert [r["impl"] for r in rows] == [*SDPA_BACKENDS, FA4]
    assert recorded.sdpa and all(t.dtype == torch.bfloat16 for given in recorded.sdpa + recorded.fa4 for t in given)


def test_the_search_says_an_fp8_problem_s_baselines_are_bf16() -> None:
    assert missing_baselines_note(Problem(1, 2, 16, 16, 64, dtype="e4m3")) == \
        "no FP8 SDPA or FA4: they run in bf16 on the dequantised inputs"
    both = missing_baselines_note(Problem(1, 2, 16, 16, 64, dtype="e4m3", softcap=30.0))
    assert both == "no SDPA baseline: SDPA has no logit softcapping; no FP8 SDPA or FA4: they run in bf16 on the " \
                   "dequantised inputs"
    assert missing_baselines_note(Problem(1, 2, 16, 16, 64, dtype="bf16")) is None


def test_ncu_replays_an_fp8_trial_with_its_descales(monkeypatch) -> None:
    """tuner profile's child launches an e4m3 kernel as its trials ran: fp8 inputs and their descales."""
    from tuner.reporting import ncu_replay

    kernel = RecordingKernel()
    built = types.SimpleNamespace(ok=True, load=lambda device: kernel)
    monkeypatch.setattr(ncu_replay, "cuda_driver", lambda device: None)
    monkeypatch.setattr(ncu_replay, "nvtx_available", lambda: True)
    monkeypatch.setattr(ncu_replay, "build", lambda variant, arch, lineinfo: built)
    variant = types.SimpleNamespace(name="v")
    monkeypatch.setattr(ncu_replay.Variant, "from_stored", classmethod(lambda cls, template, params: variant))
    monkeypatch.setattr(ncu_replay, "fp8_inputs", lambda problem: fp8_inputs(problem, "cpu", seed=4))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: None)
    assert ncu_replay.replay_trial("t", {}, FP8, "sm_90a", "r/1", launches=2) == "v"
    assert len(kernel.calls) == 3  # one warm-up, then the two launches in the range
    descales = fp8_inputs(FP8, "cpu", seed=4)[3]
    for kind, args, kwargs in kernel.calls:
        assert kind == "checked" and args[0].dtype == torch.float8_e4m3fn and args[3].dtype == torch.bfloat16
        assert all(torch.equal(a, b) for a, b in zip(kwargs["descales"], descales))
