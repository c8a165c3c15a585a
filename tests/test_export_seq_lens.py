"""Per-sequence key lengths in an exported package (CPU): attention(..., seq_lens=) semantics through the
masked-SDPA path, its errors, the one-query dispatch rule, and the transformers mask function that hands a
static cache's lengths to the decode kernels."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import test_export
from tests.test_export import _qkv
from tuner.runtime.verify import reference

pytestmark = test_export.pytestmark  # the export recompiles cubins: nvcc
export_store, exported = test_export.export_store, test_export.exported  # the module's fixtures, reused


def _expected(q, k, v, lens: list[int], causal: bool):
    """Each row on its own first L keys, through the fp32 reference (bottom-right causal); no key: zeros."""
    import torch

    out = torch.zeros_like(q)
    for b, n in enumerate(lens):
        if n:
            out[b:b + 1] = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal)[0]
    return out


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=4), sq=st.integers(1, 5), causal=st.booleans(),
       group=st.sampled_from([1, 2, 4]))
def test_seq_lens_mean_each_rows_first_keys(exported, lens: list[int], sq: int, causal: bool, group: int) -> None:
    """The rule every implementation follows (the decode kernels on the GPU test the same reference)."""
    import torch

    _, mod = exported
    q, k, v = _qkv(b=len(lens), h=2 * group, hkv=2, sq=sq, sk=40, d=64, dtype=torch.float32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = mod.attention(q, k, v, causal=causal, fallback="sdpa", seq_lens=seq_lens)
    assert out.shape == q.shape and out.stride() == torch.empty_like(q).stride()
    torch.testing.assert_close(out, _expected(q, k, v, lens, causal), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad", ["int64", "wrong_batch", "2d", "list"])
def test_wrong_seq_lens_are_a_one_line_error_even_with_the_fallback(exported, bad: str) -> None:
    import torch

    _, mod = exported
    q, k, v = _qkv(b=2, sq=1, sk=32)
    seq_lens = {"int64": torch.tensor([3, 4]), "wrong_batch": torch.tensor([3], dtype=torch.int32),
                "2d": torch.tensor([[3, 4]], dtype=torch.int32), "list": [3, 4]}[bad]
    for fallback in (None, "sdpa"):
        with pytest.raises(mod.AttentionInputError, match=r"seq_lens must be a contiguous int32 tensor of shape \(2,\)"):
            mod.attention(q, k, v, fallback=fallback, seq_lens=seq_lens)


def test_seq_lens_on_cpu_without_fallback_names_the_device(exported) -> None:
    import torch

    _, mod = exported
    q, k, v = _qkv(b=2, sq=1, sk=32)
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q, k, v, seq_lens=torch.tensor([3, 4], dtype=torch.int32))


def test_one_query_takes_the_other_causalitys_kernel() -> None:
    """A decode step (Sq 1) sees every key causal or not: with decode kernels tuned as causal, a non-causal
    one-query call still runs them, while two queries do not cross causality."""
    from tuner.runtime.shipped.dispatch import DispatchTable, Key

    entries = [{"key": {"dtype": "bf16", "head_dim": 128, "causal": True, "group": 4, "sq_bucket": 0, "sk_bucket": 13,
                        "bh_bucket": 8}, "kernel": "attn_decode_x", "trial_id": 7, "dispatch": True, "max_seq_q": 16}]
    table = DispatchTable(entries)
    assert table.choose(Key.of("bf16", 128, False, 32, 8, 1, 8200, batch=8)).entry["kernel"] == "attn_decode_x"
    assert table.choose(Key.of("bf16", 128, True, 32, 8, 1, 8200, batch=8)).entry["kernel"] == "attn_decode_x"
    assert table.choose(Key.of("bf16", 128, False, 32, 8, 2, 8200, batch=8)) is None
    # With a non-causal prefill entry too, the nearer decode entry still wins a one-query call.
    prefill = {"key": {**entries[0]["key"], "causal": False, "sq_bucket": 11, "sk_bucket": 11}, "kernel": "attn_fwd_y",
               "trial_id": 8, "dispatch": True, "max_seq_q": 0}
    both = DispatchTable(entries + [prefill])
    assert both.choose(Key.of("bf16", 128, False, 32, 8, 1, 8200, batch=8)).entry["kernel"] == "attn_decode_x"
    assert both.choose(Key.of("bf16", 128, False, 32, 8, 2048, 2048, batch=8)).entry["kernel"] == "attn_fwd_y"


def test_paged_inputs_that_would_read_the_wrong_memory_are_refused() -> None:
    """The caches' dtype and device must be q's, and a table needs a page (a null table reads as dense)."""
    import torch

    from tuner.runtime.shipped.launcher import AttentionInputError, check_paged_inputs

    q = torch.zeros(2, 4, 1, 64, dtype=torch.float16)
    kc = torch.zeros(5, 16, 2, 64, dtype=torch.float16)
    table, lens = torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(AttentionInputError,
                       match=r"k_cache and v_cache must have q's dtype \(or both float8_e4m3fn: an FP8 cache\) and device"):
        check_paged_inputs(q, kc.bfloat16(), kc.bfloat16(), table, lens)
    with pytest.raises(AttentionInputError, match="at least one page"):
        check_paged_inputs(q, kc, kc, table[:, :0], lens)


# --- transformers' mask interface ------------------------------------------------------------

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed")


@needs_transformers
def test_a_static_caches_decode_mask_becomes_key_lengths(exported) -> None:
    """A static cache (q_offset a tensor, kv_length the cache's size, no skip allowed) gives int32 [B]
    lengths q_offset + Sq, computed by tensor ops (capturable in a CUDA graph); the rows they stand for
    equal transformers' own SDPA mask."""
    import torch
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    _, mod = exported
    for sq, offset in ((1, 37), (4, 100)):
        args = dict(batch_size=3, q_length=sq, kv_length=256, kv_offset=0, mask_function=causal_mask_function,
                    attention_mask=None, allow_is_causal_skip=False)
        marker = mod._runtime.hf.transformers_mask(q_offset=torch.tensor(offset), **args)
        # 4-D, as generate() hands a prepared mask back to the model: [B, 1, 1, 1] int32
        assert marker.dtype == torch.int32 and marker.shape == (3, 1, 1, 1)
        lens = marker.reshape(-1)
        assert lens.tolist() == [offset + sq] * 3
        want = sdpa_mask(q_offset=offset, **args)
        assert torch.equal(mod._runtime.seq_lens.lens_mask(lens, sq, 256, causal=True), want)
        int_offset = mod._runtime.hf.transformers_mask(q_offset=offset, **args)  # an int offset
        assert int_offset.reshape(-1).tolist() == [offset + sq] * 3


@needs_transformers
def test_other_masks_stay_transformers_sdpa_masks(exported) -> None:
    """Padding, a sliding window, long queries and the skippable cases are left to transformers' SDPA mask."""
    import torch
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    _, mod = exported
    base = dict(batch_size=2, q_length=1, kv_length=64, q_offset=10, kv_offset=0, mask_function=causal_mask_function,
                attention_mask=None, allow_is_causal_skip=False)
    padding = torch.ones(2, 64, dtype=torch.bool)
    padding[0, :3] = False
    cases = [dict(attention_mask=padding), dict(mask_function=sliding_window_causal_mask_function(8), local_size=8),
             dict(q_length=17, q_offset=0), dict(allow_is_causal_skip=True)]
    for change in cases:
        args = {**base, **change}
        got, want = mod._runtime.hf.transformers_mask(**args), sdpa_mask(**args)
        assert (got is None and want is None) or (got.dtype == torch.bool and torch.equal(got, want)), change


def test_seq_lens_trace_under_torch_compile(exported) -> None:
    """The custom op carries seq_lens, so a compiled decode step keeps them."""
    import torch

    _, mod = exported
    q, k, v = _qkv(b=2, h=4, hkv=2, sq=2, sk=48, dtype=torch.float32)
    lens = torch.tensor([5, 48], dtype=torch.int32)

    def step(q, k, v, lens):
        return mod.attention(q, k, v, causal=True, fallback="sdpa", seq_lens=lens) * 2.0

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, lens), step(q, k, v, lens))
    torch.testing.assert_close(compiled(q, k, v, lens) / 2.0, _expected(q, k, v, [5, 48], True), atol=1e-4, rtol=1e-4)


# --- the paged form -----------------------------------------------------------------------------


def _paged(k, v, page: int, seed: int):
    """k, v [B, Hkv, Sk, D] in shuffled pages of [pages, page, Hkv, D] caches, garbage elsewhere."""
    import torch

    b, hkv, sk, d = k.shape
    per_seq = -(-sk // page)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(b * per_seq + 2, generator=gen)[:b * per_seq].view(b, per_seq)
    caches = []
    for t in (k, v):
        cache = torch.randn(b * per_seq + 2, page, hkv, d, generator=gen) * 30
        padded = torch.nn.functional.pad(t, (0, 0, 0, per_seq * page - sk))  # [B, Hkv, per_seq * page, D]
        cache[order.reshape(-1)] = padded.transpose(1, 2).reshape(b * per_seq, page, hkv, d)
        caches.append(cache)
    return caches[0], caches[1], order.to(torch.int32)


@settings(max_examples=15, deadline=None)
@given(lens=st.lists(st.integers(0, 50), min_size=1, max_size=3), sq=st.integers(1, 3), causal=st.booleans(),
       page=st.sampled_from([16, 32]), seed=st.integers(0, 99))
def test_the_paged_form_reads_each_rows_pages(exported, lens: list[int], sq: int, causal: bool, page: int,
                                              seed: int) -> None:
    """block_table + seq_lens over shuffled pages give what the dense rows give (masked SDPA path on a CPU)."""
    import torch

    _, mod = exported
    q, k, v = _qkv(b=len(lens), h=4, hkv=2, sq=sq, sk=50, d=64, dtype=torch.float32)
    kc, vc, table = _paged(k, v, page, seed)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = mod.attention(q, kc, vc, causal=causal, fallback="sdpa", seq_lens=seq_lens, block_table=table)
    torch.testing.assert_close(out, _expected(q, k, v, lens, causal), atol=1e-4, rtol=1e-4)


def test_paged_calls_name_what_is_wrong(exported) -> None:
    import torch

    _, mod = exported
    q, k, v = _qkv(b=2, h=4, hkv=2, sq=1, sk=32, d=64, dtype=torch.float32)
    kc, vc, table = _paged(k, v, 16, seed=0)
    lens = torch.tensor([3, 32], dtype=torch.int32)
    cases = [(dict(block_table=table), "needs seq_lens"),
             (dict(block_table=table.long(), seq_lens=lens), "block_table must be an int32 tensor of shape"),
             (dict(block_table=table[:1], seq_lens=lens), "block_table must be an int32 tensor of shape"),
             (dict(block_table=table, seq_lens=lens[:1]), "seq_lens must be a contiguous int32"),
             (dict(block_table=table, seq_lens=lens, v=vc[..., :32]), "k_cache and v_cache must be")]
    for change, message in cases:
        args = {**dict(q=q, k=kc, v=vc, fallback="sdpa"), **change}
        with pytest.raises(mod.AttentionInputError, match=message):
            mod.attention(**args)
    with pytest.raises(mod.AttentionInputError, match="must be a CUDA tensor"):
        mod.attention(q, kc, vc, block_table=table, seq_lens=lens)  # no fallback: the kernels need a GPU
