"""FP8 (e4m3) in an export (CPU): the manifest and LaunchShape fields of e4m3 kernels (an older manifest without
them still loads), attention()'s descale rules, the dequantising fallback against the fp32 reference, the dispatch
cell of an e4m3 call, torch.compile, export --check's e4m3 pieces, and the C++ header of an e4m3 bucket."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import pytest
from header_build import assert_user_kernel_builds, build_host_lookup

from tests.built_trials import add_built_trial
from tests.test_export import GPU_NAME, _edited_copy, _unique, import_exported
from tuner.export.run import ExportOptions, export
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.timed import Timing
from tuner.runtime.verify import problem_reference, reference, relative_error
from tuner.store import BaselineRecord, RunInfo, open_store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")

TEMPLATE = "attn_fwd_wgmma"
PARAMS = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, SWIZZLE=128, OVERLAP=False, PINGPONG=False, PRODUCER_REGS=24,
              PERSISTENT=False, TWO_P=False)
FP8 = Problem(1, 16, 4096, 4096, 128, dtype="e4m3", causal=True, heads_kv=8)
BF16 = dataclasses.replace(FP8, dtype="bf16")
ROUTED = Problem(2, 8, 2048, 2048, 128, dtype="e4m3")  # non-causal: SDPA measured faster, the cell runs the fallback
# The dequantised fallback in bf16 against the fp32 reference on the real values: bf16 rounding (2^-9) of the
# inputs and of SDPA's arithmetic; a wrong descale or head mapping is off by far more.
FALLBACK_TOLERANCE = 1.5e-2


def _variant(p: Problem) -> Variant:
    return Variant(TEMPLATE, p.head_dim, p.dtype, p.causal, PARAMS, p.window_left, p.window_right, p.softcap)


def _store(url: str) -> dict[Problem, int]:
    ids = {}
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile="h100", host="test"))
        store.add_baseline(BaselineRecord(run_id=run, problem=ROUTED, impl="sdpa_cudnn", timing=Timing(30.0)))
        for p in (FP8, BF16, ROUTED):
            ids[p] = add_built_trial(store, run, p, _variant(p), load_profile("h100").nvcc_arch, 40.0, 2e-2)
        store.finish_run(run)
    return ids


@pytest.fixture(scope="module")
def fp8_export(tmp_path_factory):
    """(trial ids, report, imported package, store url) of an export of FP8, BF16 and ROUTED."""
    root = tmp_path_factory.mktemp("fp8")
    url = f"sqlite:///{root / 'r.db'}"
    ids = _store(url)
    name = _unique("fp8")
    report = export(ExportOptions(gpu="h100", out=root / name, db_url=url))
    return ids, report, import_exported(root / name, name), url


def _qkv(b=2, h=4, hkv=2, sq=40, sk=40, d=32, bshd=False, seed=0):
    """Random FP8 q, k, v (CPU) and their descales, each (batch row, K/V head) at its own scale."""
    from tuner.runtime.verify import fp8_inputs

    p = Problem(b, h, sq, sk, d, dtype="e4m3", heads_kv=hkv, layout="bshd" if bshd else "bhsd")
    q, k, v, descales = fp8_inputs(p, "cpu", seed)
    return q, k, v, dict(zip(("q_descale", "k_descale", "v_descale"), descales))


def _real(q, k, v, scales):
    from tuner.runtime.fp8 import Descales, dequantized_inputs

    return dequantized_inputs(q, k, v, Descales(scales["q_descale"], scales["k_descale"], scales["v_descale"]))


def _meta(problem: Problem = FP8):
    import torch

    dt = {"e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16}[problem.dtype]
    q = torch.empty(problem.batch, problem.heads, problem.seq_q, problem.head_dim, dtype=dt, device="meta")
    k = torch.empty(problem.batch, problem.heads_kv, problem.seq_k, problem.head_dim, dtype=dt, device="meta")
    d = torch.ones(problem.batch, problem.heads_kv, device="meta")
    return q, k, k, dict(q_descale=d, k_descale=d, v_descale=d) if problem.dtype == "e4m3" else {}


# --- manifest and launch shapes ---------------------------------------------------------------


def test_the_manifest_holds_e4m3_entries_and_their_launch_fields(fp8_export) -> None:
    from tuner.runtime.build import launch_shape
    from tuner.runtime.shipped.launcher import LaunchShape

    ids, report, _, _ = fp8_export
    m = json.loads((report.out / report.package / "manifest.json").read_text())
    by_trial = {e["trial_id"]: e for e in m["entries"]}
    entry = by_trial[ids[FP8]]
    assert entry["key"]["dtype"] == "e4m3" and entry["problem"]["dtype"] == "e4m3" and entry["dispatch"]
    assert entry["problem_label"] == "B1 H16 Hkv8 S4096 D128 e4m3 causal" and "_e4m3_" in entry["kernel"]
    assert by_trial[ids[BF16]]["dispatch"]  # the same shape in bf16: its own key, not shadowed
    assert by_trial[ids[ROUTED]]["route"] == "sdpa"  # 30 us SDPA against 40 us
    for p in (FP8, BF16):
        launch = m["kernels"][_variant(p).name]["launch"]
        assert (launch["descales"], launch["fp8"]) == (True, p.dtype == "e4m3")  # every Hopper kernel takes them
        assert LaunchShape(**launch) == launch_shape(_variant(p))
    old = {k: v for k, v in m["kernels"][_variant(BF16).name]["launch"].items() if k not in ("descales", "fp8")}
    assert (LaunchShape(**old).descales, LaunchShape(**old).fp8) == (False, False)


def test_a_manifest_from_before_fp8_still_loads(fp8_export, tmp_path) -> None:
    """Kernels whose launch has no descales / fp8 keys (exported before them) load as 16-bit kernels."""
    def strip(m: dict) -> None:
        m["entries"] = [e for e in m["entries"] if e["key"]["dtype"] == "bf16"]
        for meta in m["kernels"].values():
            del meta["launch"]["descales"], meta["launch"]["fp8"]

    name = _edited_copy(fp8_export[1], tmp_path, "old", strip)
    mod = import_exported(tmp_path, name)
    assert mod.explain(*_meta(BF16)[:3], causal=True).kernel == _variant(BF16).name
    ex = mod.explain(*_meta(FP8)[:3], causal=True, **_meta(FP8)[3])
    assert ex.kernel is None and "dtype e4m3 is not supported: this package has kernels for bf16" in ex.error
    launch = mod.MANIFEST["kernels"][_variant(BF16).name]["launch"]
    shape = mod._runtime.launcher.LaunchShape(**launch)
    assert not shape.descales and not shape.fp8


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["kernels"][_variant(FP8).name]["launch"].__setitem__("fp8", "yes"), "launch fp8 is 'yes'"),
    (lambda m: m["kernels"][_variant(FP8).name]["launch"].__setitem__("fp8", False), "does not launch as one"),
])
def test_an_inconsistent_fp8_launch_is_an_integrity_error(fp8_export, tmp_path, edit, message) -> None:
    import sys

    name = _edited_copy(fp8_export[1], tmp_path, "bad", edit)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import {name}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "IntegrityError" in run.stderr and message in run.stderr.strip().splitlines()[-1]


# --- dispatch and explain ---------------------------------------------------------------------


def test_an_fp8_call_has_its_own_dispatch_cell_and_kernel(fp8_export) -> None:
    import torch

    ids, _, mod, _ = fp8_export
    choice = mod._runtime.choice
    assert choice.DTYPES[torch.float8_e4m3fn] == "e4m3"
    shape_q, shape_k = (1, 16, 4096, 128), (1, 8, 4096, 128)
    cells = {choice.cell(dt, shape_q, shape_k, True, (-1, -1, 0.0)) for dt in (torch.float8_e4m3fn, torch.bfloat16)}
    assert len(cells) == 2  # the dtype is part of the cell: an FP8 call never hits a bf16 kernel's cache entry
    q, k, v, scales = _meta()
    ex = mod.explain(q, k, v, causal=True, **scales)
    assert ex.kernel == _variant(FP8).name and ex.trial_id == ids[FP8] and ex.exact
    assert "dispatch key: e4m3 D128 causal group 2" in ex.text
    assert "e4m3: the kernel takes q, k, v as float8_e4m3fn with their descales and writes bfloat16" in ex.text
    assert ex.error == "q must be a CUDA tensor (got device meta)"  # a meta tensor: the device is the only limit
    assert mod.explain(*_meta(BF16)[:3], causal=True).kernel == _variant(BF16).name


def test_explain_says_where_an_fp8_call_falls_back(fp8_export) -> None:
    _, _, mod, _ = fp8_export
    q, k, v, scales = _meta(dataclasses.replace(FP8, head_dim=64))
    ex = mod.explain(q, k, v, causal=True, **scales)
    assert ex.kernel is None and "head dim 64 is not supported for causal e4m3: tuned head dims are [128]" in ex.error
    assert "fallback='sdpa' would run torch SDPA on the inputs dequantised to bfloat16 instead" in ex.text
    ex = mod.explain(*_meta(ROUTED)[:3], **_meta(ROUTED)[3])
    assert "routed to SDPA on the inputs dequantised to bfloat16: the kernel measured 0.75x" in ex.text
    assert "e4m3: the kernel takes" not in ex.text
    ex = mod.explain(*_meta()[:3], causal=True)  # no descales
    assert "float8_e4m3fn inputs need q_descale, k_descale and v_descale" in ex.error


# --- attention(): the descales' rules ---------------------------------------------------------


def _bad_calls():
    import torch

    def drop(name):
        return lambda s: {k: v for k, v in s.items() if k != name}

    return [
        ("no descales", lambda s: {}, None, "need q_descale, k_descale and v_descale"),
        ("one missing", drop("k_descale"), None, "need all three descales: k_descale missing"),
        ("wrong shape", lambda s: {**s, "q_descale": torch.ones(2, 4)}, None,
         r"q_descale must be a contiguous float32 tensor of shape \(2, 2\) \(batch, K/V heads\) on cpu"),
        ("wrong dtype", lambda s: {**s, "v_descale": s["v_descale"].half()}, None, "v_descale must be a contiguous float32"),
        ("not a tensor", lambda s: {**s, "k_descale": 1.0}, None, "k_descale must be a contiguous float32"),
        ("not contiguous", lambda s: {**s, "q_descale": torch.ones(2, 2).t()}, None, "q_descale must be a contiguous"),
        ("16-bit inputs", lambda s: s, "bf16", "scale float8_e4m3fn inputs: pass none with torch.bfloat16 ones"),
        ("mixed dtypes", lambda s: s, "mixed", r"must all be float8_e4m3fn with descales \(got torch.float8_e4m3fn, "
                                              "torch.bfloat16, torch.float8_e4m3fn"),
        ("rank 3", lambda s: s, "rank3", "float8_e4m3fn inputs must have rank 4"),
    ]


@pytest.mark.parametrize("fallback", [None, "sdpa"])
@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_descales_and_dtypes_are_one_line_errors(fp8_export, case, fallback) -> None:
    _, _, mod, _ = fp8_export
    _, scales_of, inputs, message = case
    q, k, v, scales = _qkv()
    if inputs == "bf16":
        q, k, v = (t.bfloat16() for t in (q, k, v))
    elif inputs == "mixed":
        k = k.bfloat16()
    elif inputs == "rank3":
        q, k, v = q[0], k[0], v[0]
    with pytest.raises(mod.AttentionInputError, match=message) as info:
        mod.attention(q, k, v, fallback=fallback, **scales_of(scales))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("form", ["seq_lens", "paged"])
def test_fp8_without_descales_is_refused_in_the_decode_forms_too(fp8_export, form) -> None:
    import torch

    from tuner.runtime.verify import paged_cache

    _, _, mod, _ = fp8_export
    q, k, v, _ = _qkv(sq=2, sk=48)
    lens = torch.tensor([30, 48], dtype=torch.int32)
    kwargs = dict(seq_lens=lens, fallback="sdpa")
    if form == "paged":
        table = torch.arange(2 * 3, dtype=torch.int32).view(2, 3)
        k, v, kwargs["block_table"] = paged_cache(k, 16, table), paged_cache(v, 16, table), table
    with pytest.raises(mod.AttentionInputError, match="need q_descale, k_descale and v_descale"):
        mod.attention(q, k, v, **kwargs)


def test_without_fallback_a_cpu_fp8_call_names_the_device(fp8_export) -> None:
    import torch

    _, _, mod, _ = fp8_export
    q, k, v, scales = _qkv()
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q, k, v, **scales)
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q, k, v, seq_lens=torch.tensor([40, 40], dtype=torch.int32), **scales)
    with pytest.raises(ValueError, match="fallback must be None or 'sdpa'"):
        mod.attention(q, k, v, fallback="cudnn", **scales)


class _StandIn:
    """An e4m3 kernel stand-in on the CPU: records how it is launched and writes the dequantised SDPA result."""

    def __init__(self, mod, fits: bool = True) -> None:
        self.mod, self.fits, self.calls = mod, fits, []
        self.entry = "stand_in"
        self.shape = mod._runtime.launcher.LaunchShape(128, 384, 0, descales=True, fp8=True)

    def _run(self, how, q, k, v, out, scale, descales) -> None:
        self.calls.append((how, descales))
        fp8 = self.mod._runtime.fp8_call
        out.copy_(self.mod._runtime.api._sdpa(*fp8.dequantised(q, k, v, descales), False, scale))

    def __call__(self, q, k, v, out, lse=None, scale=None, check=True, seq_lens=None, descales=None) -> None:
        assert check and lse is None and seq_lens is None
        self._run("checked", q, k, v, out, scale, descales)

    def launch_if_fit(self, q, k, v, out, lse=None, scale=None, seq_lens=None, descales=None) -> bool:
        if self.fits:
            self._run("fast", q, k, v, out, scale, descales)
        return self.fits


@pytest.mark.parametrize("routed", [False, True])
def test_the_fp8_dispatch_path_with_a_stand_in_kernel(fp8_export, monkeypatch, routed) -> None:
    """CPU tensors standing in for CUDA ones: the first call resolves, checks and runs the e4m3 kernel with the
    descales (bf16 out), the next takes the cached fast path; its descales are still checked; a 16-bit call of
    the same shape and an FP8 call without descales never reach the e4m3 kernel; a routed cell dequantises."""
    import torch

    _, _, mod, _ = fp8_export
    fp8 = mod._runtime.fp8_call
    kernel = _StandIn(mod)
    chosen = []
    monkeypatch.setattr(fp8, "check_attention_tensors", lambda *args: None)  # the device check: CPU here
    monkeypatch.setattr(fp8, "choose_kernel", lambda q, key: (chosen.append(key), None if routed else kernel)[1])
    monkeypatch.setattr(fp8, "_fp8_cache", {})
    q, k, v, scales = _qkv(h=8, hkv=2)
    descales = tuple(scales.values())
    want = mod._runtime.api._sdpa(*fp8.dequantised(q, k, v, descales), False, None)
    for _ in range(2):
        out = mod.attention(q, k, v, **scales)
        assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    assert [key.dtype for key in chosen] == ["e4m3"]  # resolved once, then the cache
    assert kernel.calls == ([] if routed else [("checked", descales), ("fast", descales)])
    (device, cached), = fp8._fp8_cache.values()
    assert device == q.get_device() and cached is (None if routed else kernel)
    with pytest.raises(mod.AttentionInputError, match="v_descale must be a contiguous float32"):
        mod.attention(q, k, v, **{**scales, "v_descale": scales["v_descale"][:1]})
    with pytest.raises(mod.AttentionInputError, match="need q_descale, k_descale and v_descale"):
        mod.attention(q, k, v)
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())  # the 16-bit path, its own checks
    assert len(kernel.calls) == (0 if routed else 2)


def test_a_layout_the_kernel_does_not_fit_goes_the_slow_checked_way(fp8_export, monkeypatch) -> None:
    _, _, mod, _ = fp8_export
    fp8 = mod._runtime.fp8_call
    kernel = _StandIn(mod, fits=False)
    monkeypatch.setattr(fp8, "check_attention_tensors", lambda *args: None)
    monkeypatch.setattr(fp8, "choose_kernel", lambda q, key: kernel)
    monkeypatch.setattr(fp8, "_fp8_cache", {})
    q, k, v, scales = _qkv()
    for _ in range(2):
        mod.attention(q, k, v, **scales)
    assert [how for how, _ in kernel.calls] == ["checked", "checked"]  # launch_if_fit said no: the checked call


# --- the dequantising fallback ----------------------------------------------------------------


FALLBACK_CASES = [
    dict(causal=False),
    dict(causal=True, sq=30, sk=50),                                   # bottom-right causal, Sq < Sk
    dict(causal=True, h=8, hkv=2),                                     # GQA: q's descale over its group
    dict(causal=False, bshd=True),                                     # BSHD as transpose(1, 2)
    dict(causal=True, window=(6, -1)),                                 # a window no e4m3 kernel has
    dict(causal=True, softcap=20.0, h=8, hkv=2),                       # a softcap: the torch implementation
]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_fallback_dequantises_and_matches_the_reference(fp8_export, case) -> None:
    """CPU tensors: no kernel runs; fallback='sdpa' dequantises to bf16 and runs the 16-bit fallback."""
    import torch

    _, _, mod, _ = fp8_export
    case = dict(case)
    causal, window, softcap = case.pop("causal"), case.pop("window", (-1, -1)), case.pop("softcap", 0.0)
    q, k, v, scales = _qkv(**case)
    out = mod.attention(q, k, v, causal=causal, fallback="sdpa", window_size=window, softcap=softcap, **scales)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert out.stride() == torch.empty_like(q, dtype=torch.bfloat16).stride()  # what the fake implementation says
    problem = Problem(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], dtype="e4m3", causal=causal,
                      heads_kv=k.shape[1], window_left=window[0], softcap=softcap)
    ref, _ = problem_reference(problem, *_real(q, k, v, scales))
    assert relative_error(out, ref) < FALLBACK_TOLERANCE
    # A descale read for the wrong (batch row, K/V head) is far off: the inputs' groups differ in scale.
    flipped = {**scales, "k_descale": scales["k_descale"].flip(1).contiguous()}
    wrong = mod.attention(q, k, v, causal=causal, fallback="sdpa", window_size=window, softcap=softcap, **flipped)
    assert relative_error(wrong, ref) > 5 * FALLBACK_TOLERANCE


@pytest.mark.parametrize("paged", [False, True])
def test_decode_forms_dequantise_too(fp8_export, paged) -> None:
    """seq_lens and paged FP8 calls (no decode kernel takes e4m3) run masked SDPA on the dequantised values."""
    import torch

    from tuner.runtime.verify import paged_cache

    _, _, mod, _ = fp8_export
    q, k, v, scales = _qkv(b=3, h=4, hkv=2, sq=2, sk=48)
    lens = [5, 48, 30]
    kwargs = dict(causal=True, fallback="sdpa", seq_lens=torch.tensor(lens, dtype=torch.int32), **scales)
    if paged:
        table = torch.arange(3 * 3, dtype=torch.int32).view(3, 3)
        out = mod.attention(q, paged_cache(k, 16, table), paged_cache(v, 16, table), block_table=table, **kwargs)
    else:
        out = mod.attention(q, k, v, **kwargs)
    assert out.dtype == torch.bfloat16
    ref, _ = reference(*_real(q, k, v, scales), True, key_lengths=lens)
    assert relative_error(out, ref) < FALLBACK_TOLERANCE


def test_an_fp8_call_traces_under_torch_compile(fp8_export) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, _, mod, _ = fp8_export
    q, k, v, scales = _qkv(h=8, hkv=2)

    def step(q, k, v, qd, kd, vd):
        return mod.attention(q, k, v, causal=True, fallback="sdpa", q_descale=qd, k_descale=kd, v_descale=vd) * 2.0

    args = (q, k, v, scales["q_descale"], scales["k_descale"], scales["v_descale"])
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), step(*args))
    with FakeTensorMode() as fake_mode:  # the fake implementation: bf16 shaped like q
        fakes = [fake_mode.from_tensor(t) for t in args]
        op = getattr(torch.ops, mod.MANIFEST["package"]).attention
        got = op(*fakes[:3], True, None, "sdpa", None, None, -1, -1, 0.0, *fakes[3:])
        assert got.dtype == torch.bfloat16 and got.shape == q.shape


# --- export --check's e4m3 pieces -------------------------------------------------------------


def test_fp8_inputs_carry_distinct_descales_per_batch_row_and_kv_head() -> None:
    import torch

    from tuner.runtime.fp8 import E4M3_MAX, Descales, dequantized_inputs
    from tuner.runtime.verify import fp8_inputs

    p = Problem(2, 8, 64, 96, 64, dtype="e4m3", heads_kv=2, layout="bshd")
    q, k, v, (dq, dk, dv) = fp8_inputs(p, "cpu", seed=3)
    assert all(t.dtype == torch.float8_e4m3fn for t in (q, k, v)) and q.shape == (2, 8, 64, 64)
    assert q.stride(1) == 64 and k.shape == (2, 2, 96, 64)  # BSHD views, as make_inputs lays them out
    for t, d, group in ((q, dq, 4), (k, dk, 1), (v, dv, 1)):
        assert d.dtype == torch.float32 and d.shape == (2, 2) and d.is_contiguous()
        amax = t.float().abs().reshape(2, 2, -1).amax(-1)
        torch.testing.assert_close(amax, torch.full_like(amax, E4M3_MAX))  # each group reaches e4m3's largest
        assert len(set(d.flatten().tolist())) == 4  # each (batch row, K/V head) at its own scale
    rq, _, _ = dequantized_inputs(q, k, v, Descales(dq, dk, dv))
    assert rq.shape == q.shape and rq.dtype == torch.float32


def test_an_e4m3_cell_checks_its_kernels_with_descales_at_the_e4m3_tolerance(fp8_export, monkeypatch) -> None:
    """_kernel_runs of an e4m3 cell: each kernel gets the descales and a bf16 output; 3% off passes (5e-2),
    a kernel that ignores the descales fails; the runs it keeps relaunch with the descales."""
    import torch

    from tuner.export import check
    from tuner.export.check_cells import check_cells
    from tuner.runtime.fp8 import Descales, dequantized_inputs
    from tuner.runtime.verify import Expected, fp8_inputs

    _, _, mod, _ = fp8_export
    cell = next(c for c in check_cells(mod.MANIFEST["entries"]) if c.key.dtype == "e4m3" and c.key.causal)
    problem = dataclasses.replace(cell.problem, batch=1, seq_q=64, seq_k=64)
    q, k, v, descales = fp8_inputs(problem, "cpu", seed=0)
    ref = Expected(problem_reference(problem, *dequantized_inputs(q, k, v, descales))[0])
    launches = []

    class Kernel:
        def __init__(self, off: float, use_descales: bool = True) -> None:
            self.off, self.use = off, use_descales

        def __call__(self, q, k, v, out, lse=None, scale=None, seq_lens=None, descales=None):
            assert out.dtype == torch.bfloat16 and torch.isnan(out.float()).all() and descales is not None
            real = dequantized_inputs(q, k, v, descales if self.use else Descales(*(torch.ones_like(d) for d in descales)))
            out.copy_(problem_reference(problem, *real)[0] * (1 + self.off))

        def launch_unchecked(self, *args):
            launches.append(args[-1])

    fakes = {"good": Kernel(0.03), "no_descales": Kernel(0.0, use_descales=False)}
    monkeypatch.setattr(mod._runtime.kernels, "load_kernel", lambda name, device: fakes[name])
    cell = dataclasses.replace(cell, problem=problem, candidates=({"kernel": "good"}, {"kernel": "no_descales"}))
    errors: dict[str, str] = {}
    data = {"q": q, "k": k, "v": v, "scale": None, "descales": descales}  # check.cell_inputs()'s form
    runs = check._kernel_runs(mod, cell, data, ref, errors)
    assert list(runs) == ["good"] and errors["no_descales"].endswith(">= 0.05")
    runs["good"]()
    assert launches == [descales]


def test_the_fallback_baselines_of_an_e4m3_cell_dequantise_in_each_call(fp8_export) -> None:
    import torch

    from tuner.export import check_fp8
    from tuner.runtime.baselines import Baseline

    _, _, mod, _ = fp8_export
    q, k, v, scales = _qkv()
    descales = (scales["q_descale"], scales["k_descale"], scales["v_descale"])
    buffers = tuple(torch.zeros_like(t, dtype=torch.bfloat16) for t in (q, k, v))
    seen = []
    wrapped = check_fp8.dequantising(mod, [Baseline("sdpa_x", lambda: seen.append(buffers[2].float().abs().sum()),
                                                    None)], q, k, v, descales, buffers)
    assert [b.name for b in wrapped] == ["sdpa_x"] and wrapped[0].backend is None
    wrapped[0].call()
    for got, want in zip(buffers, _real(q, k, v, scales)):
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    assert seen and seen[0] > 0  # the baseline ran on the dequantised values


# --- the C++ header -----------------------------------------------------------------------------


def test_the_header_names_an_e4m3_bucket_and_looks_it_up(fp8_export, tmp_path) -> None:
    """The e4m3 bucket's struct names its element types (__nv_fp8_e4m3 in, __nv_bfloat16 out), its Config the
    render's, and nearest_bucket takes dtype 2 as the Python dispatch takes e4m3 (a host program)."""
    from tuner.runtime.shipped.dispatch import DispatchTable, Key

    ids, _, _, url = fp8_export
    entries = export(ExportOptions(gpu="h100", out=tmp_path, db_url=url, format="header", name="fc_fp8",
                                   force=True)).entries
    chosen = [e for e in entries if e["dispatch"]]
    text = (tmp_path / "fc_fp8.h").read_text()
    struct = text[text.index("struct e4m3_d128_causal_g2_sq12_sk12_bh4 {"):]
    struct = struct[:struct.index("};")]
    assert "using Element = __nv_fp8_e4m3;" in struct and "using Output = __nv_bfloat16;" in struct
    assert "using Config = fc::HopperConfig<__nv_fp8_e4m3, 128, 128, 128, 2, 128," in struct
    assert "using Element = __nv_bfloat16;" in text and "2 = e4m3" in text and "q_descale, k_descale, v_descale" in text
    exe = build_host_lookup(tmp_path, "fc_fp8.h", (
        "int main() { int dt, c, sq;\n"
        '  while (std::scanf("%d %d %d", &dt, &c, &sq) == 3)\n'
        '    std::printf("%d\\n", fc_fp8::h100::nearest_bucket(dt, 128, c != 0, 2, sq, 12, 4));\n}\n'))
    codes = {"fp16": 0, "bf16": 1, "e4m3": 2}
    keys = [Key(dt, 128, causal, 2, sq, 12, 4) for dt in codes for causal in (True, False) for sq in (0, 5, 12)]
    stdin = "".join(f"{codes[k.dtype]} {int(k.causal)} {k.sq_bucket}\n" for k in keys)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=60, check=True)
    got = [None if i < 0 else chosen[i]["trial_id"] for i in map(int, run.stdout.split())]
    want = [(c.entry["trial_id"] if c else None) for c in map(DispatchTable(entries).choose, keys)]
    assert got == want and ids[FP8] in want and ids[BF16] in want


def test_the_header_instantiates_an_e4m3_kernel_with_nvcc(fp8_export, tmp_path) -> None:
    _, _, _, url = fp8_export
    out = tmp_path / "hdr"
    export(ExportOptions(gpu="h100", out=out, db_url=url, format="header", name="fc_fp8"))
    assert_user_kernel_builds(out, "attn_fwd_wgmma.cu", "fc_fp8.h",
                              "fc_fp8::h100::e4m3_d128_causal_g2_sq12_sk12_bh4::Config")


def test_the_readme_example_of_an_fp8_package_passes_descales(fp8_export) -> None:
    _, report, _, _ = fp8_export
    readme = (report.out / "README.md").read_text()
    code = readme[readme.index("```python\n") + 10:readme.index("```\n\n")]
    assert "torch.float8_e4m3fn" in code and "q_descale=one" in code and "**scales" in code
    compile(code, "README.md", "exec")
