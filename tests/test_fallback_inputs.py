"""The exported package's fallback on inputs at the edges (CPU): shapes nothing can compute are one-line errors on
every path (the slow one, a cell routed to SDPA, a window or softcap); the fallback gives what the kernels give
where queries see no key, lengths past Sk, no query rows."""

from __future__ import annotations

import pytest
import torch

from tests.test_export import export_store, exported  # noqa: F401  (fixtures)
from tuner.runtime.shipped import masked
from tuner.runtime.shipped.dispatch import NO_MASK
from tuner.runtime.shipped.seq_lens import sdpa_with_lens
from tuner.runtime.verify import reference


def _t(b: int, h: int, s: int, d: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


GOOD = dict(q=(2, 4, 8, 16), k=(2, 2, 12, 16), v=(2, 2, 12, 16))
BAD = {
    "batch": (dict(q=(2, 4, 8, 16), k=(1, 2, 12, 16), v=(1, 2, 12, 16)), "the same batch"),
    "head_dim": (dict(q=(2, 4, 8, 16), k=(2, 2, 12, 8), v=(2, 2, 12, 8)), "the same head dim"),
    "v_head_dim": (dict(q=(2, 4, 8, 16), k=(2, 2, 12, 16), v=(2, 2, 12, 32)), "the same head dim"),
    "gqa": (dict(q=(2, 6, 8, 16), k=(2, 4, 12, 16), v=(2, 4, 12, 16)), "a multiple of k's and v's"),
    "kv_length": (dict(q=(2, 4, 8, 16), k=(2, 2, 12, 16), v=(2, 2, 11, 16)), "the same heads and length"),
}
MASKS = {"none": {}, "window": dict(window_size=(3, 0)), "softcap": dict(softcap=20.0)}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("bad", BAD)
def test_shapes_nothing_computes_are_one_line_errors_with_the_fallback(exported, bad: str, mask: str) -> None:  # noqa: F811
    _, mod = exported
    shapes, message = BAD[bad]
    q, k, v = (_t(*shapes[n]) for n in "qkv")
    with pytest.raises(mod.AttentionInputError, match=message):
        mod.attention(q, k, v, causal=True, fallback="sdpa", **MASKS[mask])


@pytest.mark.parametrize("mask", MASKS)
def test_mixed_dtypes_are_one_line_errors_with_the_fallback(exported, mask: str) -> None:  # noqa: F811
    _, mod = exported
    q, k, v = (_t(*GOOD[n]) for n in "qkv")
    with pytest.raises(mod.AttentionInputError, match="q, k and v must have one dtype"):
        mod.attention(q, k.half(), v.half(), fallback="sdpa", **MASKS[mask])


def test_a_cell_routed_to_sdpa_refuses_what_the_slow_path_refuses(exported, monkeypatch) -> None:  # noqa: F811
    """A routed cell's fast path (remembered per cell, which holds other shapes too) checks the call's structure
    as the first call of the cell was checked."""
    _, mod = exported
    api = mod._runtime.api
    q, k, v = (_t(*GOOD[n], dtype=torch.float16) for n in "qkv")
    cell = api._cell(q.dtype, q.shape, k.shape, True, NO_MASK)
    monkeypatch.setitem(api._cache, cell, (q.get_device(), None))  # as _resolve leaves a routed cell
    want = reference(q.float(), k.float(), v.float(), True)[0]
    torch.testing.assert_close(mod.attention(q, k, v, causal=True).float(), want, atol=2e-3, rtol=2e-3)
    with pytest.raises(mod.AttentionInputError, match="the same heads and length"):
        mod.attention(q, k, v[:, :, :11], causal=True)
    with pytest.raises(mod.AttentionInputError, match="the same head dim"):
        mod.attention(q, k, torch.cat([v, v], dim=-1), causal=True)


@pytest.mark.parametrize("mask", [NO_MASK, (2, -1, 0.0), (-1, -1, 15.0)])
def test_causal_queries_past_the_keys_see_none_and_give_zeros(monkeypatch, mask: tuple) -> None:
    """Sq > Sk, causal: the first Sq - Sk queries see no key; the kernels give zeros there, and so does the
    fallback (not SDPA's lower-right bias, which may give NaN on CUDA)."""
    monkeypatch.setattr(masked, "sdpa", lambda *a: pytest.fail("the lower-right causal bias ran"))
    q, k, v = _t(1, 4, 10, 16, seed=1), _t(1, 2, 6, 16, seed=2), _t(1, 2, 6, 16, seed=3)
    out = masked.fallback_call(q, k, v, True, None, mask)
    assert torch.isfinite(out).all() and (out[:, :, :4] == 0).all()
    want = reference(q, k, v, True, window=mask[:2], softcap=mask[2])[0]
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", [NO_MASK, (3, -1, 0.0), (-1, -1, 10.0)])
def test_lengths_past_sk_read_as_sk_as_the_kernels_clamp_them(mask: tuple) -> None:
    q, k, v = _t(2, 2, 3, 16, seed=4), _t(2, 2, 8, 16, seed=5), _t(2, 2, 8, 16, seed=6)
    past = sdpa_with_lens(q, k, v, True, None, torch.tensor([10, 5], dtype=torch.int32), mask)
    at = sdpa_with_lens(q, k, v, True, None, torch.tensor([8, 5], dtype=torch.int32), mask)
    torch.testing.assert_close(past, at)
    want = reference(q, k, v, True, key_lengths=[8, 5], window=mask[:2], softcap=mask[2])[0]
    torch.testing.assert_close(past, want, atol=1e-5, rtol=1e-5)


def test_no_query_rows_with_a_softcap_give_an_empty_output() -> None:
    q, k, v = _t(1, 2, 0, 16), _t(1, 2, 5, 16), _t(1, 2, 5, 16)
    for mask in (NO_MASK, (-1, -1, 30.0), (2, -1, 30.0)):
        out = masked.fallback_call(q, k, v, False, None, mask)
        assert out.shape == q.shape
