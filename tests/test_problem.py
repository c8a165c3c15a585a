"""The problem: FLOP counts (FlashAttention's convention, exact pairs for causal Sq != Sk) and serialisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import TunerError
from tuner.problem import DTYPES, LAYOUTS, PACKED, Problem, causal_pairs


def _kept(seq_q: int, seq_k: int) -> int:
    """Pairs the bottom-right causal mask keeps, counted one row at a time."""
    return sum(min(max(i + seq_k - seq_q + 1, 0), seq_k) for i in range(seq_q))


@given(st.integers(1, 400), st.integers(1, 400))
def test_causal_pairs_count_what_the_mask_keeps(seq_q: int, seq_k: int) -> None:
    assert causal_pairs(seq_q, seq_k) == _kept(seq_q, seq_k)


def test_causal_flops_with_sq_ne_sk_count_the_kept_pairs() -> None:
    p = Problem(2, 4, 777, 1333, 64, causal=True)
    assert p.flops == 4 * 2 * 4 * 64 * _kept(777, 1333)
    assert 0.70 < p.flops / Problem(2, 4, 777, 1333, 64).flops < 0.72  # not the half that was counted before
    # Sq = Sk keeps FlashAttention's convention (half of the dense count), so ratios stay comparable with it.
    assert Problem(1, 1, 2048, 2048, 64, causal=True).flops == Problem(1, 1, 2048, 2048, 64).flops / 2
    assert Problem(1, 1, 4096, 16, 64, causal=True).flops == 4 * 64 * _kept(4096, 16)  # rows that see no key


@given(st.builds(Problem, st.integers(1, 64), st.sampled_from([8, 16, 32]), st.integers(1, 9000), st.integers(1, 9000),
                 st.sampled_from([64, 128]), st.sampled_from(DTYPES), st.booleans(),
                 st.sampled_from([1, 2, 8]), st.sampled_from([lay for lay in LAYOUTS if lay != PACKED])))
def test_to_dict_round_trips(problem: Problem) -> None:
    assert Problem.from_dict(problem.to_dict()) == problem


@given(st.integers(1, 64), st.integers(1, 9000), st.sampled_from(["fp16", "bf16"]), st.booleans(), st.data())
def test_a_packed_problem_round_trips_and_counts_each_sequence(batch: int, seq: int, dtype: str, causal: bool,
                                                                data: st.DataObject) -> None:
    low = data.draw(st.integers(1, seq))
    p = Problem(batch, 8, seq, seq, 128, dtype, causal, heads_kv=2, layout=PACKED, lengths=f"uniform:{low}")
    assert Problem.from_dict(p.to_dict()) == p
    assert p.packed and p.label.endswith(f" packed lengths uniform:{low}")
    lengths = p.key_lengths()
    assert len(lengths) == batch and all(low <= n <= seq for n in lengths)
    # Each sequence attends to itself only: its queries are its keys (half of them causal, FlashAttention's count).
    assert p.flops == sum(4 * 8 * 128 * n * n / (2 if causal else 1) for n in lengths)


def test_packed_sequences_are_a_16_bit_self_attention_prefill() -> None:
    with pytest.raises(TunerError, match=r"^packed sequences are a prefill of 16-bit inputs.*Sq 1 Sk 4096"):
        Problem(4, 8, 1, 4096, 128, "bf16", layout="packed")
    with pytest.raises(TunerError, match=r"^packed sequences are a prefill of 16-bit inputs.*dtype e4m3"):
        Problem(4, 8, 4096, 4096, 128, "e4m3", layout="packed")


def test_an_fp8_problem_is_e4m3_with_one_byte_elements() -> None:
    p = Problem(2, 32, 4096, 4096, 128, dtype="e4m3", causal=True, heads_kv=8)
    assert p.label == "B2 H32 Hkv8 S4096 D128 e4m3 causal"
    assert (p.elem_bytes, Problem(1, 1, 1, 1, 64, "bf16").elem_bytes, Problem(1, 1, 1, 1, 64).elem_bytes) == (1, 2, 2)
    assert p.flops == Problem(2, 32, 4096, 4096, 128, dtype="bf16", causal=True, heads_kv=8).flops
    with pytest.raises(TunerError, match=r"^unsupported dtype 'fp8'; expected one of fp16, bf16, e4m3, fp16_kv_e4m3, bf16_kv_e4m3$"):
        Problem(1, 1, 1, 1, 64, dtype="fp8")


@given(st.integers(1, 64), st.integers(1, 9000), st.integers(1, 16), st.booleans(), st.data())
def test_a_length_distribution_draws_the_same_ragged_batch_every_time(batch, seq_k, seq_q, causal, data) -> None:
    low = data.draw(st.integers(1, seq_k))
    p = Problem(batch, 32, seq_q, seq_k, 128, "bf16", causal, heads_kv=8, lengths=f"uniform:{low}")
    lengths = p.key_lengths()
    assert lengths == Problem.from_dict(p.to_dict()).key_lengths() and len(lengths) == batch
    assert all(low <= n <= seq_k for n in lengths)
    # FLOPs count each row's own keys: the sum of one-row problems of those lengths.
    rows = sum(Problem(1, 32, seq_q, n, 128, "bf16", causal, heads_kv=8).flops for n in lengths)
    assert p.flops == pytest.approx(rows)
    assert p.ragged and p.label.endswith(f" lengths uniform:{low}")
    assert Problem(batch, 32, seq_q, seq_k, 128).key_lengths() == (seq_k,) * batch


@pytest.mark.parametrize("text", ["uniform", "uniform:0", "uniform:9001", "uniform:-3", "uniform:01", "zipf:5", ""])
def test_a_bad_length_distribution_is_a_one_line_error(text: str) -> None:
    with pytest.raises(TunerError, match="unsupported key lengths .*expected 'full' or 'uniform:LO'"):
        Problem(8, 32, 1, 9000, 128, lengths=text)


def test_from_dict_names_what_is_wrong() -> None:
    with pytest.raises(TunerError, match="unknown problem field"):
        Problem.from_dict({**Problem(1, 1, 1, 1, 64).to_dict(), "extra": 1})
    with pytest.raises(TunerError, match="incomplete problem"):
        Problem.from_dict({"batch": 1})


def test_a_paged_layout_names_its_page_size() -> None:
    p = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8, layout="paged64")
    assert p.page_size == 64 and p.label.endswith(" paged64")
    assert Problem(1, 8, 1, 64, 64).page_size == 0
    with pytest.raises(TunerError, match="unsupported layout 'paged24'"):
        Problem(1, 8, 1, 64, 64, layout="paged24")


def test_lengths_without_a_shape_is_a_one_line_error(tmp_path) -> None:
    from tests.cli_helpers import run_tuner

    res = run_tuner("--db", f"sqlite:///{tmp_path / 'r.db'}", "search", "--gpu", "h100", "--lengths", "uniform:8")
    assert res.exit_code != 0 and "--lengths describes the batches of --shape problems" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
