"""Sliding windows and logit softcap in an export (CPU): the manifest carries each kernel's window and softcap
(an older manifest without them still loads), a call runs only a kernel of its own window and softcap, the
fallbacks compute what the fp32 reference does, and the C++ header names and looks up the same."""

from __future__ import annotations

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
from tuner.runtime.verify import problem_reference, reference
from tuner.store import BaselineRecord, RunInfo, open_store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")

TEMPLATE = "attn_fwd_wgmma"
PARAMS = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, SWIZZLE=128, OVERLAP=False, PINGPONG=False, PRODUCER_REGS=24,
              PERSISTENT=False, TWO_P=False)
BASE = dict(batch=1, heads=16, seq_q=4096, seq_k=4096, head_dim=128, dtype="bf16", causal=True, heads_kv=8)
PLAIN = Problem(**BASE)
WINDOWED = Problem(**BASE, window_left=1023)                       # Mistral-style sliding window
SOFTCAPPED = Problem(**BASE, softcap=50.0)                         # Gemma-2's global layers
BOTH = Problem(**BASE, window_left=4095, softcap=50.0)             # Gemma-2's local layers


def _variant(p: Problem) -> Variant:
    return Variant(TEMPLATE, p.head_dim, p.dtype, p.causal, PARAMS, p.window_left, p.window_right, p.softcap)


def _store(url: str, problems: list[Problem]) -> dict[Problem, int]:
    ids = {}
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile="h100", host="test"))
        for us, p in enumerate(problems, start=40):
            # SDPA faster than every kernel: cells route to the fallback, but a softcap's is no SDPA
            store.add_baseline(BaselineRecord(run_id=run, problem=p, impl="sdpa_cudnn", timing=Timing(30.0)))
            ids[p] = add_built_trial(store, run, p, _variant(p), load_profile("h100").nvcc_arch, float(us), 3e-4)
        store.finish_run(run)
    return ids


@pytest.fixture(scope="module")
def windows_export(tmp_path_factory):
    """(trial ids, report, imported package, store url) of an export of the four problems."""
    root = tmp_path_factory.mktemp("windows")
    url = f"sqlite:///{root / 'r.db'}"
    ids = _store(url, [PLAIN, WINDOWED, SOFTCAPPED, BOTH])
    name = _unique("win")
    report = export(ExportOptions(gpu="h100", out=root / name, db_url=url))
    return ids, report, import_exported(root / name, name), url


def _meta(shape=(1, 16, 4096, 128), kv=8):
    import torch

    q = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    k = torch.empty(shape[0], kv, shape[2], shape[3], dtype=torch.bfloat16, device="meta")
    return q, k, k


def test_the_manifest_carries_each_kernels_window_and_softcap(windows_export) -> None:
    ids, report, mod, _ = windows_export
    m = json.loads((report.out / report.package / "manifest.json").read_text())
    by_trial = {e["trial_id"]: e for e in m["entries"]}
    for p in (PLAIN, WINDOWED, SOFTCAPPED, BOTH):
        entry = by_trial[ids[p]]
        assert entry["dispatch"]  # one key per (window, softcap): none shadows another
        assert (entry["key"]["window_left"], entry["key"]["window_right"], entry["key"]["softcap"]) == \
            (p.window_left, -1, p.softcap)
        meta = m["kernels"][entry["kernel"]]
        assert (meta["window_left"], meta["window_right"], meta["softcap"]) == (p.window_left, -1, p.softcap)
        assert entry["kernel"] == _variant(p).name
    assert "_wl1023" in by_trial[ids[WINDOWED]]["kernel"] and "_sc50" in by_trial[ids[SOFTCAPPED]]["kernel"]
    # Slower than SDPA on their problems: the plain and windowed cells run the fallback; with a softcap the
    # fallback is a torch implementation, not the SDPA that was timed, so those cells keep their kernels.
    assert [by_trial[ids[p]]["route"] for p in (PLAIN, WINDOWED, SOFTCAPPED, BOTH)] == ["sdpa", "sdpa", None, None]
    text = str(mod.explain(*_meta(), causal=True, window_size=(1023, -1)))
    assert "routed to torch SDPA with a boolean window mask: the kernel measured 0.73x" in text


@pytest.mark.parametrize("window_size, softcap, expect", [
    ((-1, -1), 0.0, PLAIN), (None, None, PLAIN),
    ((1023, -1), 0.0, WINDOWED), ((1023, 0), 0.0, WINDOWED), ((1023, None), 0, WINDOWED),  # causal: right 0 == -1
    ((-1, -1), 50.0, SOFTCAPPED), ((4095, -1), 50, BOTH),
])
def test_a_call_runs_only_the_kernel_of_its_window_and_softcap(windows_export, window_size, softcap, expect) -> None:
    ids, _, mod, _ = windows_export
    ex = mod.explain(*_meta(), causal=True, window_size=window_size, softcap=softcap)
    assert ex.kernel == _variant(expect).name and ex.trial_id == ids[expect] and ex.exact
    assert "must be a CUDA tensor" in ex.error  # a meta tensor: the device is the only limit


def test_a_right_bound_of_0_without_causal_is_the_causal_kernel(windows_export) -> None:
    """FlashAttention's other spelling of a causal sliding window: window_size=(L, 0), causal=False."""
    ids, _, mod, _ = windows_export
    ex = mod.explain(*_meta(), causal=False, window_size=(1023, 0))
    assert ex.kernel == _variant(WINDOWED).name and ex.trial_id == ids[WINDOWED]
    assert mod.explain(*_meta(), causal=False, window_size=(-1, 0)).kernel == _variant(PLAIN).name


@pytest.mark.parametrize("window_size, softcap, fallback", [
    ((511, -1), 0.0, "torch SDPA with a boolean window mask"),
    ((1023, -1), 30.0, "the torch softcap implementation"),
    ((-1, -1), 30.0, "the torch softcap implementation"),
])
def test_another_window_or_softcap_falls_back_and_explain_says_why(windows_export, window_size, softcap,
                                                                    fallback) -> None:
    _, _, mod, _ = windows_export
    ex = mod.explain(*_meta(), causal=True, window_size=window_size, softcap=softcap)
    assert ex.kernel is None
    line = next(line for line in ex.text.splitlines() if "error:" in line)
    assert "is not supported for causal bf16 D128: its kernels here have" in line
    assert "window (1023, -1), no softcap" in line and f"fallback='sdpa' would run {fallback}" in line


def test_bad_window_keywords_are_one_line_errors(windows_export) -> None:
    import torch

    _, _, mod, _ = windows_export
    q = torch.randn(1, 2, 8, 64)
    for kwargs, message in ((dict(causal=True, window_size=(4, 2)), "a causal call sees no key right of its query"),
                            (dict(window_size=(-2, 0)), "window_size left must be an integer >= -1"),
                            (dict(window_size=4), r"window_size must be \(left, right\)"),
                            (dict(softcap=-1.0), "softcap must be 0 or None")):
        with pytest.raises(mod.AttentionInputError, match=message):
            mod.attention(q, q, q, fallback="sdpa", **kwargs)


FALLBACK_CASES = [
    dict(causal=True, window=(5, -1)),
    dict(causal=False, window=(7, 3), sq=30, sk=50),                 # both sides, Sq < Sk
    dict(causal=True, window=(4, -1), sq=50, sk=30),                 # Sq > Sk: rows that see no key give zeros
    dict(causal=False, window=(0, 0)),                               # each query its own key
    dict(causal=True, softcap=30.0),
    dict(causal=False, window=(9, 2), softcap=5.0, h=8, hkv=2),      # GQA, strong capping
    dict(causal=True, window=(6, -1), softcap=20.0, bshd=True),
]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_fallbacks_agree_with_the_reference(windows_export, case) -> None:
    """CPU tensors: no kernel runs, fallback='sdpa' runs SDPA under a window mask or the softcap implementation."""
    import torch

    _, _, mod, _ = windows_export
    case = dict(case)
    causal, window, softcap = case.pop("causal"), case.pop("window", (-1, -1)), case.pop("softcap", 0.0)
    b, h, hkv, sq, sk, d = 2, case.pop("h", 4), case.pop("hkv", 4), case.pop("sq", 40), case.pop("sk", 40), 32
    gen = torch.Generator().manual_seed(0)
    if case.pop("bshd", False):
        q, k, v = (torch.randn(b, s, n, d, generator=gen).transpose(1, 2) for n, s in ((h, sq), (hkv, sk), (hkv, sk)))
    else:
        q, k, v = (torch.randn(b, n, s, d, generator=gen) for n, s in ((h, sq), (hkv, sk), (hkv, sk)))
    out = mod.attention(q, k, v, causal=causal, fallback="sdpa", window_size=window, softcap=softcap)
    problem = Problem(b, h, sq, sk, d, causal=causal, heads_kv=hkv, window_left=window[0],
                      window_right=-1 if causal else window[1], softcap=softcap)
    ref, _ = problem_reference(problem, q, k, v)
    assert out.shape == q.shape and out.stride() == torch.empty_like(q).stride()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_the_softcap_fallback_works_in_chunks(windows_export, monkeypatch) -> None:
    """Long sequences fit: the scores are computed a few query rows at a time, with the same result."""
    import torch

    _, _, mod, _ = windows_export
    monkeypatch.setattr(mod._runtime.masked, "CHUNK_SCORES", 3 * 4 * 40)  # 3 query rows per chunk
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 40, 16, generator=gen) for _ in range(3))
    out = mod.attention(q, k, v, causal=True, fallback="sdpa", window_size=(8, -1), softcap=10.0)
    ref, _ = reference(q, k, v, True, window=(8, -1), softcap=10.0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_forms_take_a_window_and_softcap_through_the_fallback(windows_export, paged) -> None:
    """seq_lens (and the paged form): each row aligns its window to its own length; no decode kernel has a window
    or a softcap yet, so these run the fallback."""
    import torch

    _, _, mod, _ = windows_export
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 4, 2, 16, generator=gen)
    k, v = (torch.randn(3, 2, 48, 16, generator=gen) for _ in range(2))
    lens = [5, 48, 30]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    kwargs = dict(causal=True, fallback="sdpa", window_size=(6, -1), softcap=8.0, seq_lens=seq_lens)
    if paged:
        from tuner.runtime.verify import paged_cache

        table = torch.arange(3 * 3, dtype=torch.int32).view(3, 3)
        out = mod.attention(q, paged_cache(k, 16, table), paged_cache(v, 16, table), block_table=table, **kwargs)
    else:
        out = mod.attention(q, k, v, **kwargs)
    ref, _ = reference(q, k, v, True, key_lengths=lens, window=(6, -1), softcap=8.0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_windows_and_softcap_trace_under_torch_compile(windows_export) -> None:
    import torch

    _, _, mod, _ = windows_export
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))

    def step(q, k, v):
        return mod.attention(q, k, v, causal=True, fallback="sdpa", window_size=(4, None), softcap=6.0) * 2.0

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), step(q, k, v))


def test_a_manifest_from_before_windows_still_loads_as_no_window(windows_export, tmp_path) -> None:
    """Kernels and keys without window_left / window_right / softcap read as no window, no softcap."""
    def strip(m: dict) -> None:
        m["entries"] = [e for e in m["entries"] if e["kernel"] == _variant(PLAIN).name]
        for record in [e["key"] for e in m["entries"]] + list(m["kernels"].values()):
            for field in ("window_left", "window_right", "softcap"):
                del record[field]

    name = _edited_copy(windows_export[1], tmp_path, "old", strip)
    mod = import_exported(tmp_path, name)
    assert mod.explain(*_meta(), causal=True).kernel == _variant(PLAIN).name
    assert mod.explain(*_meta(), causal=True, window_size=(1023, -1)).kernel is None


@pytest.mark.parametrize("field, value", [("window_left", "1023"), ("window_right", -2), ("softcap", -5.0),
                                          ("softcap", True)])
def test_malformed_window_fields_are_an_integrity_error(windows_export, tmp_path, field, value) -> None:
    import sys

    name = _edited_copy(windows_export[1], tmp_path, "bad",
                        lambda m: next(iter(m["kernels"].values())).__setitem__(field, value))
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import {name}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "IntegrityError" in run.stderr
    assert f"{field} is {value!r}" in run.stderr.strip().splitlines()[-1]


def test_the_header_names_each_kernels_window_and_softcap(windows_export, tmp_path) -> None:
    """One struct per (window, softcap) with WINDOW_LEFT / WINDOW_RIGHT / SOFTCAP, and nearest_bucket takes the
    window and softcap as the Python dispatch does (a host program against DispatchTable.choose)."""
    from tuner.runtime.shipped.dispatch import DispatchTable, Key

    ids, _, _, url = windows_export
    entries = export(ExportOptions(gpu="h100", out=tmp_path, db_url=url, format="header", name="fc_win",
                                   force=True)).entries
    chosen = [e for e in entries if e["dispatch"]]
    text = (tmp_path / "fc_win.h").read_text()
    assert "struct bf16_d128_causal_wl1023_g2_sq12_sk12_bh4 {" in text
    assert "struct bf16_d128_causal_wl4095_sc50_g2_sq12_sk12_bh4 {" in text
    assert "static constexpr int WINDOW_LEFT = 4095;" in text and "static constexpr float SOFTCAP = 50.0f;" in text
    # The Config names the render's mask: fc::Mask<left, right, the softcap's fp32 bits> (50.0f: 0x42480000).
    assert "fc::Mask<4095, -1, 0x42480000u>, false, false>;" in text and "fc::Mask<1023, -1, 0x0u>, false, false>;" in text
    exe = build_host_lookup(tmp_path, "fc_win.h", (
        "int main() { int c, sq, wl, wr; double sc;\n"
        '  while (std::scanf("%d %d %d %d %lf", &c, &sq, &wl, &wr, &sc) == 5)\n'
        '    std::printf("%d\\n", fc_win::h100::nearest_bucket(1, 128, c != 0, 2, sq, 12, 4, wl, wr, sc));\n'
        "  static_assert(fc_win::h100::bf16_d128_causal_wl4095_sc50_g2_sq12_sk12_bh4::Config::LEFT == 4095);\n}\n"))
    keys = [Key("bf16", 128, causal, 2, sq, 12, 4, wl, wr, sc) for causal in (True, False) for sq in (0, 5, 12)
            for wl, wr in ((-1, -1), (1023, -1), (1023, 0), (4095, -1), (511, -1), (1023, 7)) for sc in (0.0, 50.0)
            if not (causal and wr > 0)]
    stdin = "".join(f"{int(k.causal)} {k.sq_bucket} {k.window_left} {k.window_right} {k.softcap!r}\n" for k in keys)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=60, check=True)
    got = [None if i < 0 else chosen[i]["trial_id"] for i in map(int, run.stdout.split())]
    want = [(c.entry["trial_id"] if c else None) for c in map(DispatchTable(entries).choose, keys)]
    assert got == want and set(ids.values()) <= set(want)


def test_the_header_instantiates_a_windowed_softcapped_kernel_with_nvcc(windows_export, tmp_path) -> None:
    """The header's Config names the bucket's own mask (fc::Mask<...>): a user's nvcc build of it compiles."""
    _, _, _, url = windows_export
    out = tmp_path / "hdr"
    export(ExportOptions(gpu="h100", out=out, db_url=url, format="header", name="fc_win"))
    assert_user_kernel_builds(out, "attn_fwd_wgmma.cu", "fc_win.h",
                              "fc_win::h100::bf16_d128_causal_wl4095_sc50_g2_sq12_sk12_bh4::Config")
