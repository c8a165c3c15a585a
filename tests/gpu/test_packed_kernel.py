"""Packed sequences on a real sm_90 GPU: every packed variant kind writes each sequence's rows (and only them)
and its lse within tolerance of the fp32 reference of that sequence alone; a search of a packed problem runs."""

from __future__ import annotations

import math
import random

import pytest

from tests.cli_helpers import run_tuner
from tests.gpu.reference_checks import assert_sanitizer_clean, sample_variants
from tuner.kernels.feasibility import covering_sample
from tuner.problem import Problem
from tuner.runtime.build import build, build_many
from tuner.runtime.packed import packed_inputs, unpack_into
from tuner.runtime.verify import TOLERANCE, expected_output, make_inputs, reference, relative_error

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_fwd_wgmma"

PROBLEMS = [
    Problem(5, 4, 700, 700, 128, "bf16", causal=True, heads_kv=2, layout="packed", lengths="uniform:1"),
    Problem(7, 2, 300, 300, 64, "fp16", layout="packed", lengths="uniform:1"),  # not causal, tails everywhere
    Problem(4, 4, 1000, 1000, 128, "bf16", causal=True, layout="packed", lengths="uniform:100", window_left=128),
    Problem(3, 2, 500, 500, 256, "bf16", causal=True, heads_kv=1, layout="packed", lengths="uniform:17",
            softcap=30.0),
]


def _lse_reference(problem: Problem, q, k, v, scale: float):
    """[H, total] fp32: each sequence's own lse (FlashAttention's varlen layout)."""
    import torch

    parts = []
    for b, n in enumerate(problem.key_lengths()):
        parts.append(reference(q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n], problem.causal, scale,
                               window=(problem.window_left, problem.window_right), softcap=problem.softcap)[1][0])
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_"))
def test_packed_variants_match_each_sequences_reference(problem: Problem, hopper) -> None:
    import torch

    scale = 1.0 / math.sqrt(problem.head_dim)
    variants = sample_variants(TEMPLATE, problem, hopper, extra=1)
    assert any(v.params["PERSISTENT"] for v in variants) and not all(v.params["PERSISTENT"] for v in variants)
    q, k, v = make_inputs(problem)
    packed = packed_inputs(problem, q, k, v)
    expected = expected_output(problem, q, k, v, scale)
    ref_lse = _lse_reference(problem, q, k, v, scale)
    for variant, built in zip(variants, build_many(variants, hopper.nvcc_arch)):
        assert built.ok, f"{variant.name} failed to compile:\n{built.compiled.log[-2000:]}"
        kernel = built.load()
        out = packed["q"].new_full(packed["q"].shape, float("nan"))
        lse = torch.full((problem.heads, packed["q"].shape[0]), float("nan"), device="cuda")
        kernel.packed(packed["q"], packed["k"], packed["v"], out, packed["cu"], packed["cu"], packed["max"],
                      packed["max"], scale, lse=lse)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"{variant.name}: a packed row was not written"
        padded = torch.zeros_like(q)
        unpack_into(out, padded, packed["lengths"])
        err = expected.error(padded)
        assert err < TOLERANCE[problem.dtype], f"{variant.name} on {problem.label}: rel error {err:.2e}"
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse)), f"{variant.name}: lse -inf rows differ"
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)


def test_queries_fewer_than_keys_and_empty_sequences(hopper) -> None:
    """cu_seqlens_q != cu_seqlens_k (a chunked prefill over a prefix: each sequence's queries are its last keys,
    causal bottom-right per sequence), a sequence without queries and one without keys (its rows are zeros)."""
    import torch

    problem = Problem(4, 4, 600, 600, 128, "bf16", causal=True, heads_kv=2, layout="packed", lengths="uniform:1")
    lens_q, lens_k = [130, 0, 257, 64], [600, 77, 300, 0]
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0, 130, 130, 387, 451], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 600, 677, 977, 977], dtype=torch.int32, device="cuda")
    for variant in covering_sample(TEMPLATE, problem, hopper, seed=1)[:4]:
        kernel = build(variant, hopper.nvcc_arch).load()
        out = torch.full_like(q, float("nan"))
        kernel.packed(q, k, v, out, cu_q, cu_k, max(lens_q), max(lens_k))
        torch.cuda.synchronize()
        for b in range(4):
            rows, keys = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
            if lens_q[b] == 0:
                continue
            got = out[rows].transpose(0, 1)[None]
            if lens_k[b] == 0:
                assert torch.equal(got, torch.zeros_like(got)), f"{variant.name}: a sequence without keys"
                continue
            want = reference(q[rows].transpose(0, 1)[None], k[keys].transpose(0, 1)[None],
                             v[keys].transpose(0, 1)[None], True)[0]
            err = relative_error(got, want)
            assert err < TOLERANCE["bf16"], f"{variant.name}, sequence {b}: rel error {err:.2e}"


def test_a_packed_problem_is_searched_verified_and_stored(hopper, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'packed.db'}"
    res = run_tuner("--db", url, "search", "--gpu", hopper.name, "--shape", "16,8,1024,128", "--hkv", "2",
                    "--dtype", "bf16", "--causal", "--layout", "packed", "--lengths", "uniform:64", "--trials", "3",
                    "--seed", "0", "--confirm", "2")
    assert res.exit_code == 0, res.stderr[-3000:]
    shown = run_tuner("--db", url, "results")
    assert shown.exit_code == 0 and "packed" in shown.stdout


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_packed_kernels_are_sanitizer_clean(tool: str, hopper) -> None:
    """No out-of-bounds access or shared-memory hazard: sequences from 1 token, tails, persistent and one-CTA
    grids, a window, a softcap at D256, and fewer queries than keys (sanitize_case.py packed)."""
    assert_sanitizer_clean(tool, "packed")


# The persistent packed walk (attn_fwd_wgmma/packed_order.h): only real items, longest first, dealt in a snake,
# each found by warp ballots over 32 sequences at a time. Causal and not, one and two consumers, D64 to D256.
PERSISTENT_PACKED = [
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal_packed",
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_packed",
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_2p_causal_packed",
    "attn_fwd_wgmma_d128_bf16_m64n128_s2_sw128_r24_ov_p_causal_packed",
    "attn_fwd_wgmma_d64_bf16_m192n128_s2_sw128_r32_ov_pp_p_packed",
    "attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_pp_p_causal_packed",
    # session 26: items posted to the consumers in shared memory (item_mail.h); a three-stage ring, D256's Q
    # descriptor made each tile with the overlapped loop
    "attn_fwd_wgmma_d64_bf16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed",
    "attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_pp_p_causal_packed",
]
_lengths = random.Random(25)
# (query lengths, key lengths or None: the same): very different lengths with length-1 and empty sequences over
# three ballot chunks (70 sequences); fewer queries than keys with sequences without queries or without keys
# (their rows are zeros); two one-row sequences (most CTAs of the grid get no item).
PERSISTENT_CASES = {
    "mixed70": ([_lengths.choice([0, 1, 2, 63, 64, 127, 128, 129, _lengths.randint(1, 1200)]) for _ in range(70)],
                None),
    "prefix40": ([_lengths.randint(0, 300) for _ in range(40)], None),
    "two_rows": ([1, 1], None),
}
PERSISTENT_CASES["prefix40"] = (PERSISTENT_CASES["prefix40"][0],
                                [0 if i % 9 == 4 else n + _lengths.randint(0, 700)
                                 for i, n in enumerate(PERSISTENT_CASES["prefix40"][0])])


def _cumulative(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


@pytest.mark.parametrize("case", sorted(PERSISTENT_CASES))
@pytest.mark.parametrize("name", PERSISTENT_PACKED)
def test_persistent_packed_kernels_write_every_sequence(name: str, case: str, hopper) -> None:
    """Each sequence's rows (and lse) against the fp32 reference of that sequence alone; a NaN-poisoned output
    fully written; the rows of a sequence without keys zeros and their lse -inf."""
    import torch

    from tuner.kernels.variant import parse_variant_name

    variant = parse_variant_name(name)
    causal, d = variant.causal, variant.head_dim
    lens_q, lens_k = PERSISTENT_CASES[case]
    lens_k = lens_k or lens_q
    heads, heads_kv = 4, 2
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(sum(lens_q), heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(sum(lens_k), heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    cu_q, cu_k = _cumulative(lens_q), _cumulative(lens_k)
    kernel = build(variant, hopper.nvcc_arch).load()
    out = torch.full_like(q, float("nan"))
    lse = torch.full((heads, q.shape[0]), float("nan"), device="cuda")
    scale = 1.0 / math.sqrt(d)
    kernel.packed(q, k, v, out, torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
                  torch.tensor(cu_k, dtype=torch.int32, device="cuda"), max(lens_q), max(max(lens_k), 1), scale,
                  lse=lse)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), f"{name} on {case}: a row was not written"
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        if nq == 0:
            continue
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        got = out[rows].transpose(0, 1)[None]
        if nk == 0:
            assert torch.equal(got, torch.zeros_like(got)), f"{name} on {case}: sequence {b} has no keys"
            assert torch.isinf(lse[:, rows]).all(), f"{name} on {case}: sequence {b}'s lse"
            continue
        want, want_lse = reference(q[rows].transpose(0, 1)[None], k[keys].transpose(0, 1)[None],
                                   v[keys].transpose(0, 1)[None], causal, scale)
        err = relative_error(got, want)
        assert err < TOLERANCE["bf16"], f"{name} on {case}, sequence {b} ({nq} x {nk}): rel error {err:.2e}"
        finite = torch.isfinite(want_lse[0])
        assert torch.equal(finite, torch.isfinite(lse[:, rows])), f"{name} on {case}, sequence {b}: -inf rows"
        torch.testing.assert_close(lse[:, rows][finite], want_lse[0][finite], atol=2e-3, rtol=1e-3)
