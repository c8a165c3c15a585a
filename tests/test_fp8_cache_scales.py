"""An FP8 KV cache's scales (CPU): every form vLLM passes (one, [Hkv], [B, Hkv]) becomes the [B, Hkv] tensor the
kernel reads, equal to the scale broadcast; the dtype names of a cache split into q's and k/v's."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.problem import DTYPES, KV_E4M3, kv_dtype, query_dtype
from tuner.runtime.shipped.fp8_cache import full_scales, scale_errors


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 5), hkv=st.integers(1, 6), form=st.sampled_from(["0d", "1", "per_head", "per_row", "strided"]),
       seed=st.integers(0, 1000))
def test_every_scale_form_becomes_the_broadcast_b_by_hkv_tensor(b: int, hkv: int, form: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    full = torch.rand(b, hkv, generator=gen) + 0.5
    given_scale = {"0d": full[0, 0].reshape(()), "1": full[0, :1].clone(), "per_head": full[0].clone(),
                   "per_row": full, "strided": full.t().contiguous().t()}[form]
    q = torch.zeros(b, 4 * hkv, 1, 128, dtype=torch.bfloat16)
    k = torch.zeros(b, hkv, 16, 128, dtype=torch.float8_e4m3fn)
    assert scale_errors(q, k, k, given_scale, given_scale) == []
    ks, vs = full_scales(q, hkv, given_scale, given_scale)
    want = given_scale.reshape(-1).expand(b, hkv) if given_scale.dim() < 2 else given_scale
    for s in (ks, vs):
        assert s.shape == (b, hkv) and s.is_contiguous() and s.dtype == torch.float32 and torch.equal(s, want)
    if form == "per_row":
        assert ks.data_ptr() == full.data_ptr()  # no copy when the scales are what the kernel reads


def test_a_cache_dtype_splits_into_the_query_s_and_the_cache_s() -> None:
    for dtype in DTYPES:
        cache = dtype.endswith(KV_E4M3)
        assert query_dtype(dtype) == (dtype[:4] if cache else dtype)
        assert kv_dtype(dtype) == ("e4m3" if cache else dtype)
