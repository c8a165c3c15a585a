"""The decode template's budget changes (issue 37 item 3) on a real sm_90 GPU, on variants chosen to reach each
changed path rather than sampled: the last tile's V rows zeroed past ragged lengths (NaN behind them), a paged
refill's table entries read ahead of the math (8 and 16 pages a tile: the look-ahead's first 4 and the rest read
in the refill), three ring stages (the slot and phase counters wrap at 3), 4 and 8 warps merged in turns, the FP8
merge's 16-byte adds, the causal mask's unsigned row positions, and clusters of 4 and 8."""

from __future__ import annotations

import pytest

from tests.gpu.test_decode_kernel import _paged_copy, _poisoned_past
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

LENS = [2000, 1, 777]  # none a multiple of a tile: every row has a partial last tile
CASES = [  # (variant, problem): B3, ragged, Hkv 2
    ("attn_decode_d128_bf16_m16n128_w8_sp4_s3", Problem(3, 8, 1, 2000, 128, dtype="bf16", heads_kv=2)),
    ("attn_decode_d64_fp16_m16n256_w4_sp2_s2", Problem(3, 8, 1, 2000, 64, dtype="fp16", heads_kv=2)),
    ("attn_decode_d128_bf16_m32n64_w4_sp8_s2_causal",
     Problem(3, 8, 4, 2000, 128, dtype="bf16", causal=True, heads_kv=2)),
    ("attn_decode_d128_bf16_kv_e4m3_m16n128_w4_sp2_s3", Problem(3, 8, 1, 2000, 128, dtype="bf16_kv_e4m3", heads_kv=2)),
]


@pytest.mark.parametrize("name, problem", CASES, ids=[c[0] for c in CASES])
def test_budget_paths_match_the_reference_dense_and_paged(hopper, name: str, problem: Problem) -> None:
    import torch

    from tuner.kernels.variant import parse_variant_name
    from tuner.runtime.build import build
    from tuner.runtime.fp8 import dequantized
    from tuner.runtime.verify import TOLERANCE, empty_output, fp8_inputs, make_inputs, reference, relative_error

    descales = None
    if problem.fp8:
        q, k, v, ds = fp8_inputs(problem, seed=5)
        kr, vr, descales = dequantized(k, ds.k), dequantized(v, ds.v), (None, ds.k, ds.v)
    else:
        q, k, v = make_inputs(problem, seed=5)
        kr, vr = k, v
    want = torch.zeros_like(q, dtype=torch.float32)
    for b, n in enumerate(LENS):
        want[b:b + 1] = reference(q[b:b + 1].float(), kr[b:b + 1, :, :n].float(), vr[b:b + 1, :, :n].float(),
                                  problem.causal)[0]
    built = build(parse_variant_name(name), hopper.nvcc_arch)
    assert built.ok, built.compiled.log[-2000:]
    kernel = built.load()
    seq_lens = torch.tensor(LENS, dtype=torch.int32, device="cuda")
    # Dense, with NaN behind each row's length (16-bit caches; an FP8 cache's rows as stored).
    kd, vd = (k, v) if problem.fp8 else (_poisoned_past(k, LENS), _poisoned_past(v, LENS))
    out = empty_output(q)
    kernel(q, kd, vd, out, seq_lens=seq_lens, descales=descales)
    torch.cuda.synchronize()
    err = relative_error(out, want)
    assert err < TOLERANCE[problem.dtype], f"{name} dense: rel error {err:.2e}"
    for page in (16, 64):  # BN / 16 = 8 or 16 pages a tile at 16 rows; one page a tile or fewer at 64
        if problem.fp8:  # the cache's bytes, unused rows e4m3 NaN
            kc, table = _paged_copy(k.view(torch.uint8), page, LENS, seed=page, nan=0x7F)
            vc, _ = _paged_copy(v.view(torch.uint8), page, LENS, seed=page, nan=0x7F)
            kc, vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
        else:
            kc, table = _paged_copy(k, page, LENS, seed=page)
            vc, _ = _paged_copy(v, page, LENS, seed=page)
        out = empty_output(q)
        kernel.paged(q, kc, vc, out, table, seq_lens, descales=descales)
        torch.cuda.synchronize()
        err = relative_error(out, want)
        assert err < TOLERANCE[problem.dtype], f"{name} page {page}: rel error {err:.2e}"
