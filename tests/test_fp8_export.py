"""An export ships fp16 and bf16 kernels only (its runtime takes no descales): e4m3 trials are left out of
an export of everything, and asking for them, or for a shape tuned in e4m3 alone, is a one-line error."""

from __future__ import annotations

import pytest
from cli_helpers import run_tuner
from store_factories import H100, trial

from tuner.errors import TunerError
from tuner.export.selection import select_trials
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.store import open_store

BF16 = Problem(2, 8, 2048, 2048, 128, dtype="bf16")
FP8 = Problem(2, 8, 2048, 2048, 128, dtype="e4m3")
FP8_ONLY = Problem(1, 16, 4096, 4096, 128, dtype="e4m3", causal=True)


@pytest.fixture
def store(sqlite_url):
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        for problem in (BF16, FP8, FP8_ONLY):
            store.add_trial(trial(run, problem))
        yield store


def test_an_export_of_everything_leaves_the_e4m3_trials_out(store) -> None:
    h100 = load_profile("h100")
    assert [r.problem for r in select_trials(store, h100, (), None)] == [BF16]
    assert [r.problem for r in select_trials(store, h100, ("2,8,2048,128",), None)] == [BF16]


def test_e4m3_kernels_asked_for_are_refused_in_one_line(store) -> None:
    h100 = load_profile("h100")
    with pytest.raises(TunerError, match=r"^an export cannot ship e4m3 kernels yet: its runtime takes fp16 and bf16"):
        select_trials(store, h100, (), "e4m3")
    with pytest.raises(TunerError, match=r"^the store's ok trials for h100 \(shape 1,16,4096,4096,128\) are all e4m3, "
                                         r"which an export cannot ship yet"):
        select_trials(store, h100, ("1,16,4096,128",), None)


def test_the_cli_says_why_it_exports_no_e4m3(store, sqlite_url, tmp_path) -> None:
    result = run_tuner("--db", sqlite_url, "export", "--gpu", "h100", "--out", str(tmp_path / "pkg"), "--dtype", "e4m3")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "an export cannot ship e4m3 kernels yet" in result.stderr
    assert not (tmp_path / "pkg").exists()
