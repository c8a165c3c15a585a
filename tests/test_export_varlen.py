"""Packed sequences (FlashAttention's varlen form) in an export (CPU): dispatch keeps packed and dense entries apart,
attention_varlen's errors, its per-sequence fallback against the fp32 reference, the kernel path with a fake kernel,
explain_varlen, the manifest's packed flag (an older manifest still loads), export --check's packed cells, and the
transformers route of packed rows."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from header_build import build_host_lookup
from tests.built_trials import add_built_trial
from tests.test_export import GPU_NAME, _edited_copy, _unique, import_exported
from tuner.export.check_cells import PREFILL_TOKENS, CheckCell, check_cells
from tuner.export.selection import _dispatch_key, dispatch_key, resolve_collisions
from tuner.problem import Problem
from tuner.runtime.shipped import hf, varlen
from tuner.runtime.shipped.dispatch import DispatchTable, Key, entry_key
from tuner.runtime.shipped.launcher import AttentionInputError
from tuner.runtime.timed import Timing
from tuner.runtime.verify import reference

BASE = dict(batch=8, heads=16, seq_q=2048, seq_k=2048, head_dim=128, dtype="bf16", causal=True, heads_kv=8)
DENSE, PACKED = Problem(**BASE), Problem(**BASE, layout="packed", lengths="uniform:256")


def _entries(problems: list[Problem]) -> list[dict]:
    entries = [{"key": _dispatch_key(p), "kernel": f"k{i}", "trial_id": i, "problem": p.to_dict(),
                "problem_label": p.label, "dispatch": True, "median_us": 10.0} for i, p in enumerate(problems, 1)]
    resolve_collisions(entries)
    return entries


def _packed_key(max_len: int = 2048, batch: int = 8, packed: bool = True, causal: bool = True) -> Key:
    return Key.of("bf16", 128, causal, 16, 8, max_len, max_len, batch=batch, packed=packed)


# --- dispatch ---------------------------------------------------------------------------------------------------


def test_packed_calls_choose_only_packed_entries_and_dense_calls_never_do() -> None:
    table = DispatchTable(_entries([DENSE, PACKED]))
    assert all(e["dispatch"] for e in table.entries)  # same shape, different keys: neither shadows the other
    assert table.choose(_packed_key()).entry["kernel"] == "k2"
    assert table.choose(_packed_key(max_len=300, batch=64)).entry["kernel"] == "k2"  # the nearest packed bucket
    assert table.choose(_packed_key(packed=False)).entry["kernel"] == "k1"
    only_packed, only_dense = DispatchTable(_entries([PACKED])), DispatchTable(_entries([DENSE]))
    assert only_packed.choose(_packed_key(packed=False)) is None
    assert only_dense.choose(_packed_key()) is None
    assert only_dense.unsupported_reason(_packed_key()).startswith(
        "packed sequences (varlen) are not supported by this package: its kernels take only dense calls")
    assert "dense calls are not supported" in only_packed.unsupported_reason(_packed_key(packed=False))
    # The packed kernels' own limits are named as packed ones.
    assert "for packed non-causal bf16" in only_packed.unsupported_reason(_packed_key(causal=False)) or \
        "packed non-causal attention in bf16" in only_packed.unsupported_reason(_packed_key(causal=False))
    assert "packed" in only_packed.describe() and "packed" not in only_dense.describe()


def test_a_packed_problems_key_is_packed_and_old_entries_read_as_dense() -> None:
    key = dispatch_key(PACKED)
    assert key.packed and not key.seq_lens and (key.sq_bucket, key.sk_bucket) == (11, 11)
    assert entry_key({"key": _dispatch_key(PACKED)}) == key and "packed sequences" in key.label()
    old = {"key": {"dtype": "bf16", "head_dim": 128, "causal": True, "group": 2, "sq_bucket": 11, "sk_bucket": 11},
           "kernel": "old", "trial_id": 1, "dispatch": True}
    table = DispatchTable([old])
    assert not entry_key(old).packed
    assert table.choose(_packed_key(packed=False)).entry["kernel"] == "old" and table.choose(_packed_key()) is None


def test_export_check_measures_packed_entries_on_packed_batches_only() -> None:
    """A packed entry's cells: its tuned batch first, then packed serving batches of sequences of 1 to s tokens
    (about PREFILL_TOKENS in all); only packed kernels are their candidates, and no dense cell times a packed one."""
    cells = check_cells(_entries([DENSE, PACKED]))
    packed = [c for c in cells if c.key.packed]
    assert packed[0].problem == PACKED and all(c.problem.packed for c in packed) and len(packed) > 3
    assert all(c.key == dispatch_key(c.problem) for c in cells)
    assert {e["kernel"] for c in packed for e in c.candidates} == {"k2"}
    assert {e["kernel"] for c in cells if not c.key.packed for e in c.candidates} == {"k1"}
    for c in packed[1:]:
        assert c.problem.lengths == "uniform:1" and c.problem.seq_q == c.problem.seq_k
        assert PREFILL_TOKENS / 2 < sum(c.problem.key_lengths()) < PREFILL_TOKENS * 2
        assert (c.problem.heads, c.problem.heads_kv, c.problem.head_dim) == (16, 8, 128)


@pytest.mark.parametrize("tuned", [PACKED, Problem(2, 4, 16384, 16384, 64, "fp16", causal=True, heads_kv=1,
                                                   layout="packed", lengths="uniform:1", window_left=1000)])
def test_each_packed_cell_is_timed_on_a_batch_its_calls_look_up(tuned: Problem) -> None:
    """The key of every packed cell (tuned batch and serving batches) is the one attention_varlen computes for that
    batch's packed inputs, keyed by its longest sequence: a batch whose draw falls short of s would be checked for
    a shorter cell than it stands for, and s's cell would go unmeasured."""
    from tuner.export.check_cells import serving_problems
    from tuner.runtime.packed import packed_inputs

    cells = check_cells(_entries([tuned]))
    assert [c.problem for c in cells] == [tuned] + serving_problems(tuned)
    assert len({c.key for c in cells}) == len(cells)
    for cell in cells:
        p = cell.problem
        padded = torch.empty(p.batch, p.heads, p.seq_q, p.head_dim, device="meta", dtype=torch.bfloat16)
        kv = torch.empty(p.batch, p.heads_kv, p.seq_k, p.head_dim, device="meta", dtype=torch.bfloat16)
        data = packed_inputs(p, padded, kv, kv)
        key = varlen.call_key(data["q"], data["k"], data["cu"], data["max"], data["max"], p.causal, cell.key.mask)
        assert dataclasses.replace(key, dtype=p.dtype) == cell.key, p.label


@pytest.fixture
def varlen_package(monkeypatch):
    """A package module whose _runtime is the shipped runtime (varlen.py, masked.py), kernels stubbed per test."""
    import sys
    import types

    from tuner.runtime.shipped import masked

    pkg = types.ModuleType("varlenpkg")
    pkg.AttentionInputError = AttentionInputError
    kernels = types.ModuleType("varlenpkg._runtime.kernels")
    for name, module in (("varlenpkg", pkg), ("varlenpkg._runtime.kernels", kernels),
                         ("varlenpkg._runtime.varlen", varlen), ("varlenpkg._runtime.masked", masked)):
        monkeypatch.setitem(sys.modules, name, module)
    return pkg, kernels


class _PackedStandIn:
    """A CPU stand-in for a packed kernel: each sequence's own attention, or (`across`) attention over every
    packed row at once, the bug of a kernel that ignores the sequence boundaries."""

    def __init__(self, across: bool) -> None:
        self.across, self.checks = across, []

    def packed(self, q, k, v, out, cu_q, cu_k, max_q, max_k, scale=None, check=True, lse=None):
        self.checks.append(check)
        bounds = [(0, q.shape[0])] if self.across else list(zip(cu_q.tolist(), cu_q.tolist()[1:]))
        for a, b in bounds:
            view = [t[a:b].transpose(0, 1)[None].float() for t in (q, k, v)]
            out[a:b] = reference(*view, True, scale)[0][0].transpose(0, 1).to(out.dtype)


@pytest.mark.parametrize("problem", [Problem(5, 4, 96, 96, 32, "bf16", causal=True, heads_kv=2, layout="packed",
                                             lengths="uniform:1"),
                                     Problem(3, 2, 64, 64, 32, "fp16", causal=True, layout="packed",
                                             lengths="uniform:8", window_left=16)])
def test_a_packed_cells_kernels_are_verified_per_sequence_and_timed_against_the_packages_fallback(
        problem: Problem, varlen_package) -> None:
    from tuner.export import check
    from tuner.runtime.shipped.input_checks import packed_view

    pkg, kernels = varlen_package
    data, ref = check.cell_inputs(problem, "cpu")
    fakes = {"own": _PackedStandIn(False), "across": _PackedStandIn(True)}
    kernels.load_kernel = lambda name, device: fakes[name]
    cell = CheckCell(problem, dispatch_key(problem), ({"kernel": "own"}, {"kernel": "across"}))
    errors: dict[str, str] = {}
    runs = check._kernel_runs(pkg, cell, data, ref, errors)
    if problem.local:  # the stand-in knows no window: both fail, each with its error
        assert not runs and errors["own"].startswith("relative error")
    else:
        assert list(runs) == ["own"] and errors["across"].startswith("relative error")
        runs["own"]()
        assert fakes["own"].checks == [True, False]  # the checked verification, then the timed launch unchecked
    (fallback,) = check.routed_baselines(pkg, problem, data)
    assert fallback.name == ("masked_per_sequence" if problem.local else "sdpa_per_sequence")
    with fallback.restrict():
        got = fallback.call()
    padded = torch.zeros(data["q"].shape, dtype=got.dtype)
    start = 0
    for b, n in enumerate(problem.key_lengths()):
        padded[b, :, :n] = packed_view(got[start:start + n])[0]
        start += n
    assert ref.error(padded) < 2e-2  # the package's fallback computes the cell's own attention


def test_a_manifest_whose_packed_flag_disagrees_with_its_kernel_is_malformed() -> None:
    from tuner.runtime.shipped.kernels import _malformed

    sha = "0" * 64
    kernel = {"entry": "k", "source": "k.cu", "source_sha256": sha, "min_compute_capability": [9, 0],
              "cubins": {"sm_90a": {"path": "k.cubin", "sha256": sha}}, "launch": {"packed": False}}
    data = {"package": "p", "version": "1", "nvcc_options": [], "kernels": {"k": kernel},
            "entries": [{"key": _dispatch_key(PACKED), "kernel": "k"}]}
    assert "is for packed sequences, but its kernel 'k' does not launch as one" in _malformed(data)
    kernel["launch"]["packed"] = True
    assert _malformed(data) is None
    data["entries"][0]["key"]["packed"] = "yes"
    assert "packed is 'yes', not true or false" in _malformed(data)


# --- the fallback and the errors (the runtime in place; CPU tensors) -------------------------------------------


def _packed_inputs(lens_q: list[int], lens_k: list[int], h: int = 4, hkv: int = 2, d: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, generator=gen)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=gen) for _ in range(2))
    cu = [torch.tensor([0] + list(torch.tensor(n).cumsum(0).tolist()), dtype=torch.int32) for n in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def _expected(q, k, v, lens_q, lens_k, causal, window=(-1, -1), softcap=0.0, scale=None):
    """Each sequence on its own through the fp32 reference (bottom-right causal and window); no key: zeros."""
    out, q0, k0 = torch.zeros_like(q), 0, 0
    for lq, lk in zip(lens_q, lens_k):
        if lq and lk:
            qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk]))
            out[q0:q0 + lq] = reference(qb, kb, vb, causal, scale, window=window, softcap=softcap)[0][0].transpose(0, 1)
        q0, k0 = q0 + lq, k0 + lk
    return out


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 24)), min_size=1, max_size=4),
       causal=st.booleans(), group=st.sampled_from([1, 2]), left=st.sampled_from([-1, 0, 5]),
       softcap=st.sampled_from([0.0, 3.0]), same=st.booleans())
def test_the_fallback_is_flash_attn_varlen_funcs_forward(lens, causal, group, left, softcap, same) -> None:
    """Per sequence: its own queries and keys, causal and windows bottom-right, GQA, a softcap; a sequence with no
    key gives zeros (self-attention packing when `same`: each sequence's queries are its keys)."""
    lens_q = [a for a, _ in lens]
    lens_k = lens_q if same else [b for _, b in lens]
    q, k, v, cu_q, cu_k = _packed_inputs(lens_q, lens_k, h=2 * group, hkv=2)
    out = varlen.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q + [1]), max(lens_k + [1]), causal=causal,
                                  window_size=(left, -1), softcap=softcap, fallback="sdpa")
    assert out.shape == q.shape and out.dtype == q.dtype
    want = _expected(q, k, v, lens_q, lens_k, causal, (left, -1), softcap)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_the_fallback_keeps_gradients_and_the_scale() -> None:
    q, k, v, cu_q, cu_k = _packed_inputs([5, 9], [7, 9])
    q.requires_grad_(True)
    out = varlen.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, causal=True, scale=0.3, fallback="sdpa")
    torch.testing.assert_close(out, _expected(q.detach(), k, v, [5, 9], [7, 9], True, scale=0.3), atol=1e-4, rtol=1e-4)
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


@pytest.mark.parametrize("bad, match", [
    ("cu_int64", r"cu_seqlens_q must be an int32 tensor \[B \+ 1\] on cpu \(got torch.int64"),
    ("cu_lengths", r"cu_seqlens_q and cu_seqlens_k must have one length \(3 != 2\)"),
    ("max_float", r"max_seqlen_q must be a positive int \(got 9.0\)"),
    ("max_tensor", r"max_seqlen_k must be a positive int \(got tensor\(9"),
    ("kv_shapes", r"packed k and v must be \[total_k, Hkv, D\]"),
    ("rank4", r"packed q, k and v must be rank-3 tensors"),
    ("past_total", r"cu_seqlens_k must lie within 0 .. 16 \(the tensor's rows\); got 0 .. 17"),
    ("decreasing", r"cu_seqlens_q must be non-decreasing \(sequence 1 has length -2\)"),
    ("past_max", r"cu_seqlens_q: sequence 1 has 9 rows, more than max_seqlen 8"),
])
def test_bad_inputs_are_one_line_errors_even_with_the_fallback(bad: str, match: str) -> None:
    q, k, v, cu_q, cu_k = _packed_inputs([5, 9], [7, 9])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=9, max_seqlen_k=9)
    change = {"cu_int64": dict(cu_seqlens_q=cu_q.long()), "cu_lengths": dict(cu_seqlens_k=cu_k[:2]),
              "max_float": dict(max_seqlen_q=9.0), "max_tensor": dict(max_seqlen_k=torch.tensor(9)),
              "kv_shapes": dict(v=v[:, :1]), "rank4": dict(q=q.unsqueeze(0)),
              "past_total": dict(cu_seqlens_k=torch.tensor([0, 7, 17], dtype=torch.int32)),
              "decreasing": dict(cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32)),
              "past_max": dict(max_seqlen_q=8)}[bad]
    # The lengths' values are read on the host by the fallback alone (the kernels take them on the device).
    for fallback in ("sdpa",) if bad in ("past_total", "decreasing", "past_max") else (None, "sdpa"):
        with pytest.raises(AttentionInputError, match=match) as err:
            varlen.attention_varlen(**{**args, **change}, fallback=fallback)
        assert "\n" not in str(err.value)


def test_cpu_tensors_without_the_fallback_name_the_device() -> None:
    q, k, v, cu_q, cu_k = _packed_inputs([5, 9], [7, 9])
    with pytest.raises(AttentionInputError, match="q must be a CUDA tensor"):
        varlen.attention_varlen(q, k, v, cu_q, cu_k, 9, 9)
    with pytest.raises(ValueError, match="fallback must be None or 'sdpa'"):
        varlen.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, fallback="eager")


# --- the kernel path, with a fake kernel ------------------------------------------------------------------------


def test_a_packed_call_launches_the_chosen_packed_kernel_once_checked(monkeypatch) -> None:
    """The key asked for is packed, bucketed by max_seqlen and the number of sequences; the kernel is launched
    through AttentionKernel.packed unchecked (the call was checked); a routed entry (None) runs the fallback; the
    choice is remembered per cell."""
    q, k, v, cu_q, cu_k = (t.bfloat16() if t.is_floating_point() else t for t in _packed_inputs([5, 9], [7, 9]))
    asked, launched = [], []

    class Kernel:
        def packed(self, q, k, v, out, cu_q, cu_k, max_q, max_k, scale=None, check=True, lse=None):
            launched.append((max_q, max_k, check))
            out.fill_(7.0)

    kernel = {"k": Kernel()}
    monkeypatch.setattr(varlen, "check_packed_inputs", lambda *args: None)  # its device check: CPU here
    monkeypatch.setattr(varlen, "choose_kernel", lambda q, key: (asked.append(key), kernel["k"])[1])
    monkeypatch.setattr(varlen, "_cache", {})
    for _ in range(2):
        out = varlen.attention_varlen(q, k, v, cu_q, cu_k, 9, 600, causal=True)
        assert (out == 7.0).all() and out.shape == q.shape
    assert launched == [(9, 600, False)] * 2 and len(asked) == 1  # chosen once for the cell
    key = asked[0]
    assert key.packed and (key.sq_bucket, key.sk_bucket, key.bh_bucket, key.group) == (4, 10, 3, 2)
    kernel["k"] = None  # an entry routed to SDPA
    out = varlen.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, causal=True)
    want = _expected(q.float(), k.float(), v.float(), [5, 9], [7, 9], True)
    assert out.dtype == torch.bfloat16 and (out == 7.0).sum() == 0
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_a_kernel_that_does_not_load_on_this_card_falls_back_with_sdpa(monkeypatch) -> None:
    q, k, v, cu_q, cu_k = (t.half() if t.is_floating_point() else t for t in _packed_inputs([4, 6], [4, 6]))

    def no_load(q, key):  # what load_kernel raises for a kernel this card cannot run
        raise varlen.GpuUnavailableError("attn_fwd_wgmma_x does not load on cuda:-1: attn_fwd_wgmma_x needs compute "
                                         "capability 9.0+, cuda:-1 has 8.0")

    monkeypatch.setattr(varlen, "check_packed_inputs", lambda *args: None)
    monkeypatch.setattr(varlen, "choose_kernel", no_load)
    monkeypatch.setattr(varlen, "_cache", {})
    with pytest.raises(varlen.GpuUnavailableError, match="does not load on cuda:-1: .* needs compute capability 9.0"):
        varlen.attention_varlen(q, k, v, cu_q, cu_k, 6, 6)
    out = varlen.attention_varlen(q, k, v, cu_q, cu_k, 6, 6, fallback="sdpa")
    want = _expected(q.float(), k.float(), v.float(), [4, 6], [4, 6], False)
    torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)


def test_packed_mask_is_each_sequences_own_bottom_right_block() -> None:
    """The one-mask form (transformers' SDPA path with dropout) gives what the per-sequence fallback gives."""
    from torch.nn.functional import scaled_dot_product_attention

    lens_q, lens_k = [3, 0, 6, 4], [5, 2, 6, 4]
    q, k, v, cu_q, cu_k = _packed_inputs(lens_q, lens_k, h=2, hkv=2)
    for causal, window in ((True, (-1, -1)), (False, (2, 1)), (True, (1, -1))):
        mask = varlen.packed_mask(cu_q, cu_k, q.shape[0], k.shape[0], causal, window)
        assert mask.shape == (1, 1, 13, 17)
        out = scaled_dot_product_attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), attn_mask=mask)
        want = _expected(q, k, v, lens_q, lens_k, causal, window)
        torch.testing.assert_close(out[0].transpose(0, 1), want, atol=1e-4, rtol=1e-4)


# --- transformers ----------------------------------------------------------------------------------------------


class _Module(torch.nn.Module):
    """An attention layer as transformers' integrations see it (causal, a GQA group of 2)."""

    is_causal = True
    num_key_value_groups = 2


def test_transformers_packed_rows_with_flash_kwargs_run_attention_varlen(monkeypatch) -> None:
    """DataCollatorWithFlattening's kwargs (cu_seq_lens_q/k, max_length_q/k) on one flattened row [1, H, total, D]
    go to attention_varlen with the module's causality, the window of `sliding_window` and the softcap; the result is
    [1, total, H, D], each sequence on its own. Without the kwargs, or with a padding-sized batch, they do not."""
    lens = [5, 11, 4]
    q, k, v, cu, _ = _packed_inputs(lens, lens, h=4, hkv=2)
    query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=11, max_length_k=torch.tensor(11),
                  position_ids=torch.cat([torch.arange(n) for n in lens]).unsqueeze(0))
    calls = []
    real = hf.attention_varlen
    monkeypatch.setattr(hf, "attention_varlen", lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    out, _ = hf.transformers_attention(_Module(), query, key, value, None, scaling=0.25, sliding_window=4,
                                       softcap=5.0, **kwargs)
    assert calls[-1]["window_size"] == (3, -1) and calls[-1]["softcap"] == 5.0 and calls[-1]["causal"]
    want = _expected(q, k, v, lens, lens, True, (3, -1), 5.0, scale=0.25)
    torch.testing.assert_close(out, want.unsqueeze(0), atol=1e-4, rtol=1e-4)
    # transformers' own block-diagonal mask from packed position_ids says the same: the kwargs still decide.
    block = varlen.packed_mask(cu, cu, 20, 20, True)
    out, _ = hf.transformers_attention(_Module(), query, key, value, block, **kwargs)
    torch.testing.assert_close(out, _expected(q, k, v, lens, lens, True).unsqueeze(0), atol=1e-4, rtol=1e-4)
    assert len(calls) == 2
    padding = torch.ones(1, 1, 20, 20, dtype=torch.float32)  # not a mask the lengths describe: transformers' path
    hf.transformers_attention(_Module(), query, key, value, padding, **kwargs)
    hf.transformers_attention(_Module(), query, key, value, None, position_ids=kwargs["position_ids"])
    assert len(calls) == 2


def test_transformers_packed_rows_with_dropout_take_the_block_diagonal_mask() -> None:
    pytest.importorskip("transformers")
    lens = [6, 10]
    q, k, v, cu, _ = _packed_inputs(lens, lens, h=4, hkv=2)
    query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    torch.manual_seed(0)
    out, _ = hf.transformers_attention(_Module(), query, key, value, None, dropout=1e-9, cu_seq_lens_q=cu,
                                       cu_seq_lens_k=cu, max_length_q=10, max_length_k=10)
    torch.testing.assert_close(out, _expected(q, k, v, lens, lens, True).unsqueeze(0), atol=1e-4, rtol=1e-4)


# --- an export with a packed entry (nvcc) -----------------------------------------------------------------------

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (export recompiles cubins)")
SMALL = dict(batch=4, heads=4, seq_q=512, seq_k=512, head_dim=128, dtype="bf16", causal=True, heads_kv=2)


@pytest.fixture(scope="module")
def packed_export(tmp_path_factory):
    """(trial ids, report, imported package) of an export of a dense and a packed problem (wgmma, h100)."""
    from tests.test_export_windows import PARAMS, TEMPLATE
    from tuner.export.run import ExportOptions, export
    from tuner.kernels.variant import Variant
    from tuner.profiles import load_profile
    from tuner.store import BaselineRecord, RunInfo, open_store

    root = tmp_path_factory.mktemp("varlen")
    url, ids = f"sqlite:///{root / 'r.db'}", {}
    with open_store(url) as store:
        run = store.start_run(RunInfo(gpu_name=GPU_NAME, profile="h100", host="test"))
        for name, p in (("dense", Problem(**SMALL)), ("packed", Problem(**SMALL, layout="packed",
                                                                           lengths="uniform:64"))):
            store.add_baseline(BaselineRecord(run_id=run, problem=p, impl="sdpa_flash", timing=Timing(50.0)))
            v = Variant(TEMPLATE, p.head_dim, p.dtype, p.causal, PARAMS, packed=p.packed)
            ids[name] = add_built_trial(store, run, p, v, load_profile("h100").nvcc_arch, 20.0, 3e-4)
        store.finish_run(run)
    name = _unique("varlen")
    report = export(ExportOptions(gpu="h100", out=root / name, db_url=url))
    return ids, report, import_exported(root / name, name)


def _meta_packed(total: int = 1500, sequences: int = 4):
    q = torch.empty(total, 4, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(total, 2, 128, dtype=torch.bfloat16, device="meta")
    return q, k, k, torch.empty(sequences + 1, dtype=torch.int32, device="meta")


@needs_nvcc
def test_the_export_ships_the_packed_entry_and_its_entry_point(packed_export) -> None:
    ids, report, mod = packed_export
    m = json.loads((report.out / report.package / "manifest.json").read_text())
    by_trial = {e["trial_id"]: e for e in m["entries"]}
    packed, dense = by_trial[ids["packed"]], by_trial[ids["dense"]]
    assert packed["key"]["packed"] and not dense["key"]["packed"] and packed["dispatch"] and dense["dispatch"]
    assert packed["kernel"].endswith("_packed") and m["kernels"][packed["kernel"]]["launch"]["packed"]
    assert not m["kernels"][dense["kernel"]]["launch"]["packed"]
    assert {"attention_varlen", "explain_varlen"} <= set(mod.__all__) and mod.attention_varlen.explain is \
        mod.explain_varlen
    q, k, v, cu = _meta_packed()
    ex = mod.explain_varlen(q, k, v, cu, cu, 512, 512, causal=True)
    assert ex.kernel == packed["kernel"] and ex.trial_id == ids["packed"] and ex.exact
    assert "packed sequences (varlen)" in ex.text and "must be a CUDA tensor" in ex.error
    assert "per-sequence torch SDPA instead" in ex.text
    dense_q = torch.empty(4, 4, 512, 128, dtype=torch.bfloat16, device="meta")
    dense_k = torch.empty(4, 2, 512, 128, dtype=torch.bfloat16, device="meta")
    assert mod.explain(dense_q, dense_k, dense_k, causal=True).kernel == dense["kernel"]
    none = mod.explain_varlen(q, k, v, cu, cu, 512, 512, causal=False)
    assert none.kernel is None and "packed non-causal" in none.error


@needs_nvcc
def test_the_exported_fallback_runs_on_cpu_and_an_old_manifest_loads(packed_export, tmp_path) -> None:
    _, report, mod = packed_export
    lens = [3, 8]
    q, k, v, cu, _ = _packed_inputs(lens, lens, h=4, hkv=2)
    out = mod.attention_varlen(q, k, v, cu, cu, 8, 8, causal=True, fallback="sdpa")
    torch.testing.assert_close(out, _expected(q, k, v, lens, lens, True), atol=1e-4, rtol=1e-4)

    def drop_packed(m):  # a manifest from before packed sequences: no packed entry nor launch flag
        m["entries"] = [e for e in m["entries"] if not e["key"].pop("packed")]
        for meta in m["kernels"].values():
            meta["launch"].pop("packed", None)

    name = _edited_copy(report, tmp_path, "old_varlen", drop_packed)
    old = import_exported(tmp_path, name)
    q, k, v, cu = _meta_packed()
    assert "packed sequences (varlen) are not supported" in old.explain_varlen(q, k, v, cu, cu, 512, 512,
                                                                             causal=True).error


@needs_nvcc
def test_the_header_keeps_packed_and_dense_buckets_apart(packed_export, tmp_path) -> None:
    """A packed bucket has its own struct (suffix _packed, PACKED true) and nearest_bucket() matches packed exactly."""
    import subprocess

    from tuner.export.run import ExportOptions, export

    ids, report, _ = packed_export
    url = f"sqlite:///{report.out.parent / 'r.db'}"
    entries = export(ExportOptions(gpu="h100", out=tmp_path, db_url=url, format="header", name="fc_var")).entries
    chosen = [e for e in entries if e["dispatch"]]
    text = (tmp_path / "fc_var.h").read_text()
    assert "struct bf16_d128_causal_g2_sq9_sk9_bh4_packed {" in text and "struct bf16_d128_causal_g2_sq9_sk9_bh4 {" in text
    assert text.count("static constexpr bool PACKED = true;") == 1
    exe = build_host_lookup(tmp_path, "fc_var.h", (
        "int main() { for (int p = 0; p < 2; ++p)\n"
        '  std::printf("%d\\n", fc_var::h100::nearest_bucket(1, 128, true, 2, 9, 9, 4, -1, -1, 0.0, 0, false, p));\n}\n'))
    got = [chosen[int(i)]["trial_id"] for i in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    assert got == [ids["dense"], ids["packed"]]
