"""The end-of-search summary compares the best kernel with the baselines of the run that measured it."""

from __future__ import annotations

import optuna
import pytest

from tests.store_factories import BIG, H100, baseline, trial
from tuner.search.study import ATTR_VARIANT
from tuner.search.summary import summarize


def _study_with_best(name: str, value: float) -> optuna.Study:
    study = optuna.create_study(direction="minimize")
    t = study.ask()
    t.set_user_attr(ATTR_VARIANT, name)
    study.tell(t, value)
    return study


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_best_served_from_an_earlier_run_uses_that_runs_baselines(store) -> None:
    earlier, now = store.start_run(H100), store.start_run(H100)
    store.add_baseline(baseline(earlier, BIG, "sdpa_flash", 120.0))
    store.add_baseline(baseline(now, BIG, "sdpa_flash", 90.0))  # this invocation's baseline
    rec = trial(earlier, BIG, median_us=100.0)
    store.add_trial(rec)
    summary = summarize(_study_with_best(rec.variant_name, 100.0), BIG, store, run_ids=[now])
    assert summary.best_variant == rec.variant_name
    assert (summary.baseline_impl, summary.baseline_us) == ("sdpa_flash", 120.0)
    assert summary.ratio == pytest.approx(1.2)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_without_a_stored_row_the_runs_fastest_baseline_is_used(store) -> None:
    now = store.start_run(H100)
    store.add_baseline(baseline(now, BIG, "sdpa_cudnn", 80.0))
    store.add_baseline(baseline(now, BIG, "sdpa_flash", 95.0))
    summary = summarize(_study_with_best("not_stored", 100.0), BIG, store, run_ids=[now])
    assert (summary.baseline_impl, summary.baseline_us) == ("sdpa_cudnn", 80.0)


def test_the_time_line_gives_one_worker_its_phases_and_several_their_mean():
    from tuner.cli.search_commands import time_line
    from tuner.search.run import SearchReport

    base = dict(summaries=[], run_ids=[1], studies=["s"], interrupted=False, measured=1, reused=0, asked=1)
    one = SearchReport(**base, seconds=(("start-up", 2.0), ("measuring", 6.0)), wall_s=10.0)
    assert time_line(one) == "time: 10.0 s wall; start-up 2.0 s (20%), measuring 6.0 s (60%), other 2.0 s (20%)"
    two = SearchReport(**base, seconds=(("start-up", 4.0), ("measuring", 8.0)), wall_s=8.0, workers=2)
    assert time_line(two) == ("time: 8.0 s wall; 2 workers, per worker (mean): start-up 2.0 s (25%), "
                              "measuring 4.0 s (50%), other 2.0 s (25%)")
