"""The fp32 reference of long problems covers sampled query rows: those rows equal the full reference's,
and the error of a kernel's output is measured on them (CPU torch, small shapes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tuner.problem import Problem  # noqa: E402
from tuner.runtime import verify  # noqa: E402
from tuner.runtime.verify import Expected, expected_output, make_inputs, problem_reference, sampled_rows  # noqa: E402

PROBLEMS = [
    Problem(1, 2, 1500, 1500, 64, dtype="bf16", causal=True),
    Problem(2, 4, 1200, 1300, 64, heads_kv=2, window_left=100, window_right=40),
    Problem(1, 2, 1100, 1100, 32, causal=True, window_left=300, softcap=20.0),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label)
def test_sampled_rows_are_the_full_reference_s_rows(problem: Problem) -> None:
    q, k, v = make_inputs(problem, "cpu", seed=1)
    rows = sampled_rows(problem.seq_q)
    assert rows is not None and rows[0] == 0 and rows[-1] == problem.seq_q - 1
    full, full_lse = problem_reference(problem, q, k, v)
    part, part_lse = problem_reference(problem, q, k, v, rows=rows)
    torch.testing.assert_close(part, full[:, :, rows], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part_lse, full_lse[:, :, rows], rtol=1e-5, atol=1e-6)


def test_the_error_is_measured_on_the_sampled_rows(monkeypatch) -> None:
    problem = PROBLEMS[0]
    q, k, v = make_inputs(problem, "cpu", seed=2)
    monkeypatch.setattr(verify, "FULL_REFERENCE_SCORES", 1000)  # as if 1500^2 scores did not fit
    expected = expected_output(problem, q, k, v)
    assert expected.rows == sampled_rows(problem.seq_q)
    out = problem_reference(problem, q, k, v)[0].to(torch.bfloat16)
    assert expected.error(out) < verify.TOLERANCE["bf16"]
    wrong = out.clone()
    wrong[:, :, problem.seq_q - 1] += 1.0  # the last row: the one causal rows past 2^16 keys would break
    assert expected.error(wrong) > verify.TOLERANCE["bf16"]


def test_short_problems_get_the_full_reference() -> None:
    problem = Problem(1, 2, 300, 300, 32)
    q, k, v = make_inputs(problem, "cpu", seed=3)
    expected = expected_output(problem, q, k, v)
    assert expected.rows is None and expected.out.shape == (1, 2, 300, 32)
    assert sampled_rows(1024) is None
    assert Expected(expected.out).error(expected.out) == 0.0


def test_a_packed_sequence_too_long_for_every_row_is_checked_on_sampled_rows(monkeypatch) -> None:
    """A packed batch's long sequences (here: past 1100 keys) get sampled rows, its short ones every row: the
    reference fits where one sequence's n x n scores would not (a packed search at 128K), and the error still
    sees a wrong last row of the long one, and any wrong row of the short ones."""
    problem = Problem(4, 2, 1500, 1500, 32, dtype="bf16", causal=True, layout="packed", lengths="uniform:200",
                      window_left=700)
    lengths = problem.key_lengths()
    assert max(lengths) > 1100 and min(lengths) <= 1000, lengths
    q, k, v = make_inputs(problem, "cpu", seed=4)
    full = expected_output(problem, q, k, v)
    monkeypatch.setattr(verify, "FULL_REFERENCE_SCORES", 1100 * 1100)
    part = expected_output(problem, q, k, v)
    for b, n in enumerate(lengths):
        checked = part.valid[b, 0, :, 0].nonzero().flatten().tolist()
        assert checked == (list(range(n)) if n <= 1100 else sampled_rows(n)), (b, n)
        torch.testing.assert_close(part.out[b, :, checked], full.out[b, :, checked], rtol=1e-5, atol=1e-6)
    out = full.out.to(torch.bfloat16)
    assert part.error(out) < verify.TOLERANCE["bf16"]
    for b, n in enumerate(lengths):
        wrong = out.clone()
        wrong[b, :, n - 1] += 1.0
        assert part.error(wrong) > verify.TOLERANCE["bf16"], (b, n)
