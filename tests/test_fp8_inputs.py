"""FP8 (e4m3) inputs on a CPU: quantisation with descales [B, Hkv], dequantisation, the reference and the
output buffer of an fp8 problem, and the tolerance's reasoning simulated."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tuner.errors import TunerError  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from tuner.runtime.fp8 import E4M3_MAX, quantize  # noqa: E402
from tuner.runtime.verify import (  # noqa: E402
    TOLERANCE,
    Descales,
    dequantized,
    dequantized_inputs,
    empty_output,
    expected_output,
    fp8_inputs,
    make_inputs,
    problem_reference,
    relative_error,
)


def _group_amax(t, heads_per_kv: int):
    return t.float().abs().reshape(t.shape[0], t.shape[1] // heads_per_kv, -1).amax(dim=-1)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), heads_kv=st.integers(1, 3), group=st.sampled_from([1, 2, 4]),
       seq=st.integers(1, 40), seed=st.integers(0, 2**31), bshd=st.booleans())
def test_quantize_rounds_each_element_within_e4m3_s_step(batch, heads_kv, group, seq, seed, bshd) -> None:
    """Each element comes back within 2^-4 of itself (3 mantissa bits) or, below e4m3's normals, within
    half its smallest step (2^-10 of the descale); the descale is amax / 448 over each batch row and K/V
    head (its q heads together); the fp8 tensor is laid out like the input."""
    gen = torch.Generator().manual_seed(seed)
    heads = heads_kv * group
    x = torch.randn(batch, seq, heads, 32, generator=gen) if bshd else torch.randn(batch, heads, seq, 32, generator=gen)
    x = x.transpose(1, 2) if bshd else x
    x = x * torch.exp(torch.randn(batch, heads, 1, 1, generator=gen))  # heads of different magnitudes
    fp8, descale = quantize(x, group)
    assert fp8.dtype == torch.float8_e4m3fn and fp8.stride() == x.stride()
    assert descale.dtype == torch.float32 and descale.shape == (batch, heads_kv)
    assert torch.allclose(descale, _group_amax(x, group) / E4M3_MAX)
    back = dequantized(fp8, descale, group)
    per_element = descale.repeat_interleave(group, dim=1)[:, :, None, None]
    bound = torch.maximum(x.abs() * 2**-4, per_element * 2**-10) * (1 + 1e-5)
    assert back.dtype == torch.float32 and back.stride() == x.stride()
    assert ((back - x).abs() <= bound).all()
    assert torch.allclose(_group_amax(back, group), descale * E4M3_MAX)  # the largest lands on 448


def test_an_all_zero_group_gets_descale_one() -> None:
    x = torch.zeros(1, 2, 4, 8)
    x[0, 1] = 3.0
    fp8, descale = quantize(x)
    assert descale[0].tolist() == pytest.approx([1.0, 3.0 / E4M3_MAX]) and (fp8.float()[0, 0] == 0).all()
    assert (fp8.float()[0, 1] == E4M3_MAX).all()


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_fp8_inputs_are_e4m3_in_the_problem_s_layout_with_descales_per_batch_row_and_kv_head(layout: str) -> None:
    problem = Problem(2, 8, 48, 80, 64, dtype="e4m3", heads_kv=2, layout=layout)
    q, k, v, descales = fp8_inputs(problem, "cpu", seed=5)
    assert isinstance(descales, Descales) and isinstance(descales, tuple) and len(descales) == 3
    assert (q.shape, k.shape, v.shape) == ((2, 8, 48, 64), (2, 2, 80, 64), (2, 2, 80, 64))
    assert {t.dtype for t in (q, k, v)} == {torch.float8_e4m3fn}
    for t in (q, k, v):  # BSHD: [B, S, H, D] in memory, seen as [B, H, S, D]
        assert t.is_contiguous() == (layout == "bhsd")
        assert t.transpose(1, 2).is_contiguous() == (layout == "bshd")
    for d in descales:
        assert d.dtype == torch.float32 and d.shape == (2, 2) and (d > 0).all()
    assert len({round(x, 7) for x in descales.q.reshape(-1).tolist()}) == 4  # the groups' descales differ
    q_real, k_real, v_real = dequantized_inputs(q, k, v, descales)
    assert torch.allclose(_group_amax(q_real, 4), descales.q * E4M3_MAX)  # over the group's 4 q heads
    assert torch.allclose(_group_amax(k_real, 1), descales.k * E4M3_MAX)
    assert torch.equal(q_real[:, 4:8], dequantized(q[:, 4:8], descales.q[:, 1:2], 4))
    again = fp8_inputs(problem, "cpu", seed=5)
    assert all(torch.equal(a.float(), b.float()) for a, b in zip((q, k, v, *descales), (*again[:3], *again[3])))
    assert all(torch.equal(a.float(), b.float()) for a, b in zip((q, k, v), make_inputs(problem, "cpu", seed=5)))


def test_fp8_inputs_are_for_e4m3_problems_only() -> None:
    with pytest.raises(TunerError, match=r"^fp8_inputs makes FP8 inputs, not bf16 ones"):
        fp8_inputs(Problem(1, 2, 8, 8, 64, dtype="bf16"), "cpu", seed=1)


def test_dequantized_takes_an_output_dtype_for_the_bf16_baselines() -> None:
    q, k, v, descales = fp8_inputs(Problem(1, 4, 16, 16, 64, dtype="e4m3", heads_kv=2, layout="bshd"), "cpu", 1)
    real = dequantized(q, descales.q, 2)
    bf16 = dequantized(q, descales.q, 2, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.stride() == q.stride()
    assert relative_error(bf16, real) < 2**-8


def test_the_reference_of_an_fp8_problem_is_the_fp32_reference_of_its_real_values() -> None:
    problem = Problem(2, 4, 40, 72, 64, dtype="e4m3", heads_kv=2, causal=True, window_left=20, softcap=30.0)
    q, k, v, descales = fp8_inputs(problem, "cpu", seed=2)
    expected = expected_output(problem, q, k, v, 0.125, descales=descales)
    want = problem_reference(problem, *dequantized_inputs(q, k, v, descales), 0.125)[0]
    assert expected.rows is None and torch.equal(expected.out, want)
    with pytest.raises(TunerError, match=r"^the reference of a problem in e4m3 needs the scales of its FP8 inputs"):
        expected_output(problem, q, k, v, 0.125)


def test_a_kernel_reading_the_wrong_descales_fails_verification() -> None:
    """fp8_inputs scales each (batch row, K/V head) differently: the descales of a neighbouring K/V head
    (q's read per q head, say) move the output far past the tolerance."""
    problem = Problem(2, 8, 64, 64, 64, dtype="e4m3", heads_kv=4)
    for seed in range(3):
        q, k, v, descales = fp8_inputs(problem, "cpu", seed=seed)
        right = expected_output(problem, q, k, v, descales=descales)
        for name in ("q", "k", "v"):
            wrong = descales._replace(**{name: getattr(descales, name).roll(1, dims=1)})
            assert right.error(expected_output(problem, q, k, v, descales=wrong).out) > 4 * TOLERANCE["e4m3"]


def test_the_output_of_an_fp8_problem_is_bf16_laid_out_like_q_and_poisoned() -> None:
    q = make_inputs(Problem(1, 4, 16, 16, 64, dtype="e4m3", layout="bshd"), "cpu", seed=3)[0]
    out = empty_output(q)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and out.stride() == q.stride()
    assert out.isnan().all()
    half = make_inputs(Problem(1, 4, 16, 16, 64), "cpu", seed=3)[0]
    assert empty_output(half).dtype == torch.float16


def _fp8_p_attention(problem: Problem, q, k, v, scale: float, max_offset: int):
    """Attention as an FP8 kernel computes it (FlashAttention-3): fp32 scores and row sums, P (times
    2^max_offset, as its softmax.h's Max_offset) rounded to e4m3 before P.V, a bf16 output; no mask."""
    group = problem.heads // problem.heads_kv
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 2.0**max_offset
    return ((p.to(torch.float8_e4m3fn).float() @ v) / p.sum(-1, keepdim=True)).to(torch.bfloat16)


def _p_rounding_error(seq_k: int, max_offset: int) -> float:
    problem = Problem(1, 4, 16, seq_k, 128, dtype="e4m3")
    q, k, v, descales = fp8_inputs(problem, "cpu", seed=1)
    scale = 1 / math.sqrt(128)
    expected = expected_output(problem, q, k, v, scale, descales=descales)
    return expected.error(_fp8_p_attention(problem, *dequantized_inputs(q, k, v, descales), scale, max_offset))


@pytest.mark.parametrize("max_offset", [0, 8])
@pytest.mark.parametrize("seq_k", [256, 8192])
def test_the_e4m3_tolerance_holds_what_p_s_rounding_costs(seq_k: int, max_offset: int) -> None:
    """TOLERANCE["e4m3"]'s reasoning: P rounded to e4m3 costs ~0.02-0.03 of relative L2 error, past bf16's
    tolerance and well below e4m3's."""
    assert TOLERANCE["bf16"] < _p_rounding_error(seq_k, max_offset) < 0.7 * TOLERANCE["e4m3"]


def test_without_fa3_s_max_offset_long_rows_lose_their_small_probabilities() -> None:
    """At Sk 128K most of a row's probability lies below e4m3's normals: unscaled P rounds it coarsely (close
    to the tolerance); P scaled by 2^8 first keeps the error where shorter rows have it."""
    plain, offset = _p_rounding_error(131072, 0), _p_rounding_error(131072, 8)
    assert offset < 0.6 * TOLERANCE["e4m3"] < plain < TOLERANCE["e4m3"], (plain, offset)
