"""Run a few variants on tail shapes; executed under compute-sanitizer by the gpu tests.

Usage: python sanitize_case.py [mma|wgmma|decode|decode_sm80|packed]   (default mma)
"""

import sys

import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.packed import packed_inputs
from tuner.runtime.verify import empty_output, fp8_inputs, make_inputs

CASES = {
    "mma": [
        ("attn_fwd_mma_d64_fp16_m64n64_w4_q_rows_xor_s2_qreg", Problem(1, 2, 17, 33, 64)),
        ("attn_fwd_mma_d64_fp16_m64n64_w4_kv2_pad_s3_qsmem_causal", Problem(1, 2, 77, 50, 64, causal=True)),
        ("attn_fwd_mma_d128_bf16_m128n32_w8_kv2_none_s1_qsmem", Problem(2, 2, 130, 1, 128, dtype="bf16", heads_kv=1)),
        # A window (tiles left of it skipped: the K/V ring starts past tile 0) and a softcap, with tails
        ("attn_fwd_mma_d64_bf16_m64n64_w4_kv2_pad_s3_qreg_causal_wl100_sc30",
         Problem(1, 2, 333, 500, 64, dtype="bf16", causal=True, window_left=100, softcap=30.0)),
    ],
    "wgmma": [
        ("attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp", Problem(1, 2, 300, 333, 64)),
        ("attn_fwd_wgmma_d64_fp16_m192n96_s3_sw64_r32_ov_causal", Problem(1, 2, 77, 250, 64, causal=True)),
        ("attn_fwd_wgmma_d128_bf16_m64n64_s2_sw32_r24", Problem(2, 2, 130, 1, 128, dtype="bf16", heads_kv=1)),
        ("attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_pp_causal", Problem(1, 2, 260, 200, 128, causal=True)),
        ("attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal", Problem(2, 3, 700, 300, 64, causal=True)),
        ("attn_fwd_wgmma_d128_e4m3_m128n192_s2_sw64_r24_ov_pp", Problem(1, 4, 300, 333, 128, dtype="e4m3", heads_kv=2)),
        ("attn_fwd_wgmma_d64_e4m3_m128n128_s3_sw64_r24_ov_pp_p_causal", Problem(2, 2, 700, 300, 64, dtype="e4m3",
                                                                               causal=True)),
        # Sliding windows (tiles outside skipped, partial tiles masked) and a softcap, with tails
        ("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl100",
         Problem(1, 2, 333, 500, 128, dtype="bf16", causal=True, window_left=100)),
        ("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl64_sc30",
         Problem(2, 2, 300, 300, 128, dtype="bf16", causal=True, window_left=64, softcap=30.0)),
    ],
    "decode": [
        ("attn_decode_d128_bf16_m16n64_w4_sp4_s3", Problem(2, 8, 1, 1000, 128, dtype="bf16", heads_kv=2)),
        ("attn_decode_d64_fp16_m32n128_w8_sp8_s2_causal", Problem(1, 8, 5, 300, 64, causal=True, heads_kv=1)),
        ("attn_decode_d64_fp16_m16n32_w2_sp2_s4_causal", Problem(1, 2, 20, 10, 64, causal=True)),
        ("attn_decode_d128_bf16_kv_e4m3_m16n64_w2_sp4_s3", Problem(2, 8, 1, 1000, 128, dtype="bf16_kv_e4m3", heads_kv=2)),
        ("attn_decode_d128_fp16_kv_e4m3_m32n128_w8_sp2_s2_causal", Problem(1, 8, 5, 300, 128, dtype="fp16_kv_e4m3",
                                                                         causal=True, heads_kv=1)),
        ("attn_decode_d128_bf16_m16n64_w4_sp4_s3_causal_wl100",
         Problem(2, 8, 1, 1000, 128, dtype="bf16", causal=True, heads_kv=2, window_left=100)),
        ("attn_decode_d128_bf16_m16n64_w4_sp4_s3_causal_wl64_sc30",
         Problem(1, 8, 3, 777, 128, dtype="bf16", causal=True, heads_kv=2, window_left=64, softcap=30.0)),
    ],
    # Packed sequences (lengths from 1, tails in every sequence): one CTA per item and persistent, a window, a
    # softcap at D256; each also with fewer queries than keys per sequence (cu_seqlens_q != cu_seqlens_k).
    "packed": [
        ("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed",
         Problem(5, 4, 700, 700, 128, "bf16", causal=True, heads_kv=2, layout="packed", lengths="uniform:1")),
        ("attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed",
         Problem(4, 2, 500, 500, 64, causal=True, layout="packed", lengths="uniform:1")),
        ("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl100_packed",
         Problem(3, 2, 600, 600, 128, "bf16", causal=True, layout="packed", lengths="uniform:50", window_left=100)),
        ("attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_causal_sc30_packed",
         Problem(3, 2, 300, 300, 256, "bf16", causal=True, heads_kv=1, layout="packed", lengths="uniform:17",
                 softcap=30.0)),
        # The persistent walk over real items (packed_order.h) with two ballot chunks of sequences, not causal
        ("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_packed",
         Problem(40, 2, 300, 300, 128, "bf16", layout="packed", lengths="uniform:1")),
    ],
    "decode_sm80": [  # the cp.async ring and the workspace merge (the last CTA of a row block)
        ("attn_decode_sm80_d128_bf16_m16n64_w4_sp4_s3", Problem(2, 8, 1, 1000, 128, dtype="bf16", heads_kv=2)),
        ("attn_decode_sm80_d64_fp16_m32n128_w8_sp8_s2_causal", Problem(1, 8, 5, 300, 64, causal=True, heads_kv=1)),
        ("attn_decode_sm80_d64_fp16_m16n32_w2_sp2_s4_causal", Problem(1, 2, 20, 10, 64, causal=True)),
    ],
}

cuda_driver(0)
arch = "sm_%d%d" % torch.cuda.get_device_capability()
arch = arch + "a" if arch == "sm_90" else arch
for name, problem in CASES[sys.argv[1] if len(sys.argv) > 1 else "mma"]:
    variant = parse_variant_name(name)
    built = build(variant, arch)
    assert built.ok, built.compiled.log
    kernel = built.load()
    q, k, v, descales = fp8_inputs(problem) if problem.fp8 else (*make_inputs(problem), None)
    if problem.layout == "packed":
        p = packed_inputs(problem, q, k, v)
        out = torch.empty_like(p["q"])
        lse = torch.empty(problem.heads, p["q"].shape[0], device="cuda")
        scale = problem.head_dim ** -0.5
        kernel.packed(p["q"], p["k"], p["v"], out, p["cu"], p["cu"], p["max"], p["max"], scale, lse=lse)
        cu_q = p["cu"] - torch.arange(problem.batch + 1, dtype=torch.int32, device="cuda")  # one query fewer each
        kernel.packed(p["q"], p["k"], p["v"], out, cu_q, p["cu"], p["max"], p["max"], scale, lse=lse)
        torch.cuda.synchronize()
        continue
    out = empty_output(q)
    lse = torch.empty(problem.batch, problem.heads, problem.seq_q, device="cuda")
    kernel(q, k, v, out, lse, descales=descales)
    if built.shape.splits:  # decode kernels: ragged lengths, then a paged cache (16-row pages, shuffled)
        lens = torch.arange(problem.batch, dtype=torch.int32, device="cuda") * 7 + 1
        kernel(q, k, v, out, seq_lens=lens, descales=descales)
        b, hkv, sk, d = k.shape
        per_seq = -(-sk // 16)
        table = torch.randperm(b * per_seq, device="cuda").to(torch.int32).view(b, per_seq)
        kc, vc = (torch.randn(b * per_seq, 16, hkv, d, device="cuda").to(k.dtype) for _ in range(2))
        kernel.paged(q, kc, vc, out, table, torch.full((b,), sk, dtype=torch.int32, device="cuda"), descales=descales)
    torch.cuda.synchronize()
print("sanitize cases ran")
