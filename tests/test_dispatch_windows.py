"""Dispatch by window and softcap (pure Python, no package): a key runs only entries of its own window and
softcap, the keywords' rules, the fallbacks against the fp32 reference, and export --check's windowed cells."""

from __future__ import annotations

import pytest

from tuner.export.check_cells import check_cells
from tuner.export.selection import _dispatch_key, dispatch_key, resolve_collisions
from tuner.models import DECODE
from tuner.problem import Problem
from tuner.runtime.shipped.dispatch import DispatchTable, Key
from tuner.runtime.shipped.launcher import AttentionInputError
from tuner.runtime.shipped.masked import call_mask, fallback, keys_kept
from tuner.runtime.verify import problem_reference

BASE = dict(batch=1, heads=32, seq_q=8192, seq_k=8192, head_dim=128, dtype="bf16", causal=True, heads_kv=8)
PLAIN, LOCAL = Problem(**BASE), Problem(**BASE, window_left=4095)
CAPPED, LOCAL_CAPPED = Problem(**BASE, softcap=50.0), Problem(**BASE, window_left=4095, softcap=50.0)


def _entries(problems: list[Problem]) -> list[dict]:
    entries = [{"key": _dispatch_key(p), "kernel": f"k{i}", "trial_id": i, "problem": p.to_dict(),
                "problem_label": p.label, "dispatch": True} for i, p in enumerate(problems, start=1)]
    resolve_collisions(entries)
    return entries


def _call(sq: int = 8192, sk: int = 8192, causal: bool = True, mask: tuple = (-1, -1, 0.0)) -> Key:
    return Key.of("bf16", 128, causal, 32, 8, sq, sk, batch=1, mask=mask)


def test_a_key_runs_only_entries_of_its_window_and_softcap() -> None:
    table = DispatchTable(_entries([PLAIN, LOCAL, CAPPED, LOCAL_CAPPED]))
    assert all(e["dispatch"] for e in table.entries)  # four keys: none shadows another
    for mask, kernel in (((-1, -1, 0.0), "k1"), ((4095, -1, 0.0), "k2"), ((-1, -1, 50.0), "k3"),
                         ((4095, -1, 50.0), "k4"), ((4095, 0, 50), "k4")):  # causal: right bound 0 is -1
        assert table.choose(_call(mask=mask)).entry["kernel"] == kernel
        assert table.choose(_call(sq=3000, sk=3000, mask=mask)).entry["kernel"] == kernel  # nearest bucket, same mask
    for mask in ((1023, -1, 0.0), (4095, -1, 30.0), (-1, -1, 30.0)):
        assert table.choose(_call(mask=mask)) is None
    only_local = DispatchTable(_entries([LOCAL]))
    reason = only_local.unsupported_reason(_call(mask=(1023, -1, 0.0)))
    assert reason == ("window (1023, -1), no softcap is not supported for causal bf16 D128: its kernels here have "
                      "window (4095, -1), no softcap (a window and a softcap are compiled in)")
    assert "window (4095, -1)" in only_local.describe() and "D128 causal" in only_local.describe()


def test_one_query_takes_the_other_causalitys_entry_of_its_left_window_and_softcap() -> None:
    """Sq 1 aligned to the keys' end: causal or not, and whatever the right bound, it sees the same keys."""
    table = DispatchTable(_entries([LOCAL_CAPPED]))
    assert table.choose(_call(sq=1, causal=False, mask=(4095, 7, 50.0))).entry["kernel"] == "k1"
    assert table.choose(_call(sq=1, causal=False, mask=(4095, -1, 0.0))) is None
    assert table.choose(_call(sq=2, causal=False, mask=(4095, -1, 50.0))) is None


def test_an_entry_from_before_windows_reads_as_no_window() -> None:
    old = {"key": {"dtype": "bf16", "head_dim": 128, "causal": True, "group": 4, "sq_bucket": 13, "sk_bucket": 13},
           "kernel": "old", "trial_id": 1, "dispatch": True}
    table = DispatchTable([old])
    assert table.choose(_call()).entry["kernel"] == "old"
    assert table.choose(_call(mask=(4095, -1, 0.0))) is None


def test_the_exported_key_holds_the_problems_window_and_softcap() -> None:
    key = _dispatch_key(LOCAL_CAPPED)
    assert (key["window_left"], key["window_right"], key["softcap"]) == (4095, -1, 50.0)
    noncausal = Problem(**{**BASE, "causal": False}, window_left=64, window_right=32)
    assert dispatch_key(noncausal).mask == (64, 32, 0.0)


@pytest.mark.parametrize("window_size, softcap, causal, expect", [
    ((-1, -1), 0.0, False, (-1, -1, 0.0)), (None, None, True, (-1, -1, 0.0)),
    ((None, 5), 0, False, (-1, 5, 0.0)), ((100, 0), 30, True, (100, -1, 30.0)), ((100, None), 2.5, True, (100, -1, 2.5)),
])
def test_call_mask_spells_a_window_as_problem_does(window_size, softcap, causal, expect) -> None:
    assert call_mask(window_size, softcap, causal) == expect
    assert Key.of("fp16", 64, causal, 1, 1, 8, 8, mask=expect).mask == expect


@pytest.mark.parametrize("window_size, softcap, causal", [
    ((4, 1), 0.0, True), ((-2, 0), 0.0, False), ((1.5, 0), 0.0, False), ((True, 0), 0.0, False), (4, 0.0, False),
    ((1, 2, 3), 0.0, False), ((-1, -1), -1.0, False), ((-1, -1), float("inf"), False), ((-1, -1), "50", False),
])
def test_call_mask_refuses_what_flashattention_would_not_take(window_size, softcap, causal) -> None:
    with pytest.raises(AttentionInputError) as err:
        call_mask(window_size, softcap, causal)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", [
    dict(causal=True, window=(3, -1)), dict(causal=False, window=(2, 5), sq=9, sk=20),
    dict(causal=True, window=(2, -1), sq=20, sk=9), dict(causal=True, softcap=4.0, window=(5, -1), hkv=1),
    dict(causal=False, softcap=1.5),
])
def test_the_fallbacks_match_problem_reference(case) -> None:
    """SDPA under keys_kept, and the softcap implementation, give what the fp32 reference gives (a row that sees
    no key: zeros, as the kernels)."""
    import torch

    causal, window, softcap = case["causal"], case.get("window", (-1, -1)), case.get("softcap", 0.0)
    sq, sk, hkv = case.get("sq", 16), case.get("sk", 16), case.get("hkv", 2)
    problem = Problem(2, 4, sq, sk, 16, causal=causal, heads_kv=hkv, window_left=window[0],
                      window_right=window[1], softcap=softcap)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, sq, 16, generator=gen)
    k, v = (torch.randn(2, hkv, sk, 16, generator=gen) for _ in range(2))
    out = fallback(q, k, v, causal, None, call_mask(window, softcap, causal))
    torch.testing.assert_close(out, problem_reference(problem, q, k, v)[0], atol=1e-5, rtol=1e-5)


def test_keys_kept_is_none_only_where_every_key_is_seen() -> None:
    import torch

    assert keys_kept(4, 6, False, (-1, -1), "cpu") is None
    kept = keys_kept(2, 6, True, (1, -1), "cpu")
    assert kept.shape == (1, 1, 2, 6)
    # bottom-right: the two queries sit at positions 4 and 5 and see themselves and one key before
    assert kept[0, 0].tolist() == [[False, False, False, True, True, False], [False, False, False, False, True, True]]
    lens = keys_kept(1, 6, True, (1, -1), "cpu", torch.tensor([3, 6], dtype=torch.int32))
    assert lens[:, 0, 0].tolist() == [[False, True, True, False, False, False], [False, False, False, False, True, True]]


def test_check_cells_of_a_windowed_kind_keep_its_window_and_softcap() -> None:
    """export --check measures a layer kind's serving shapes with its own window and softcap, candidates of that
    mask only (a windowed kernel never stands in for the plain one, nor the reverse)."""
    cells = check_cells(_entries([PLAIN, LOCAL_CAPPED]))
    assert {c.key.mask for c in cells} == {(-1, -1, 0.0), (4095, -1, 50.0)}
    for cell in cells:
        assert cell.key == dispatch_key(cell.problem)
        assert (cell.problem.window_left, cell.problem.softcap) == cell.key.mask[::2]
        assert {e["kernel"] for e in cell.candidates} == ({"k1"} if cell.key.mask[0] < 0 else {"k2"})
    local = [c for c in cells if c.key.mask[0] >= 0 and c.problem.seq_q <= 16]
    assert len(local) == len(DECODE)  # the kind's decode steps too, with the window (the fallback's work)
