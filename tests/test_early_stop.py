"""--early-stop (issue 38, item 3): a study ends once its best has not improved by more than the noise for N
budgeted trials; --trials stays the ceiling; the count lives in the study, so a resume continues it.
Replay backend with scripted times, no GPU."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import optuna
import pytest

from tuner.backends.replay import ReplayBackend
from tuner.errors import TunerError
from tuner.profiles import load_profile
from tuner.runtime.timed import Timing
from tuner.search.early_stop import budgeted_values, plateaued, trials_since_improvement
from tuner.search.hooks import Hooks
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.samplers import study_name
from tuner.search.study import counts_toward_budget, finished_trials, storage_for
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store


class _Scripted:
    """The replay backend, but every ok measurement's µs is script(n), n counting this backend's ok ones."""

    needs_compile = False

    def __init__(self, recording, script: Callable[[int], float]) -> None:
        self.inner = ReplayBackend(recording.url, load_profile(recording.profile))
        self.script, self.n = script, 0

    def device_facts(self):
        return self.inner.device_facts()

    def baselines(self, problem):
        return self.inner.baselines(problem)

    def measure(self, problem, variant, built, *, range_prefix=""):
        m = self.inner.measure(problem, variant, built)
        if m.status is not TrialStatus.OK:
            return m
        self.n += 1
        us = self.script(self.n)
        return replace(m, timing=Timing(us, us, us))

    def confirm(self, *args, **kwargs):
        return self.inner.confirm(*args, **kwargs)

    def close(self) -> None:
        pass


def _search(rec, db_url: str, script: Callable[[int], float], **changes):
    p = rec.problem
    options = SearchOptions(gpu=rec.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                            dtype=p.dtype, causal=p.causal, backend="replay", replay_from=rec.url, db_url=db_url,
                            trials=60, seed=3, confirm=0, warm_start=0)
    backend = _Scripted(rec, script)
    report = run_search(replace(options, **changes), hooks=Hooks(make_backend=lambda *_a, **_k: backend))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", p), storage=storage_for(db_url))
    return report, study


def test_the_rule_counts_trials_since_a_gain_beyond_the_noise() -> None:
    assert trials_since_improvement([10.0, 9.95, 9.92, 9.8]) == 0  # 9.8 is 2% below 10: a gain
    assert trials_since_improvement([10.0, 9.95, 9.92]) == 2  # 0.8% in all: noise
    assert trials_since_improvement([None, None]) == 2
    assert not plateaued([10.0] * 5, 5) and plateaued([10.0] * 6, 5)  # the first sets the best to beat


def test_a_plateau_stops_the_study_early_and_stores_what_it_ran(replay_recording, sqlite_url):
    # Better by 5% a trial for 10 trials, then flat within 0.5%: 10 gains, then 15 trials without one.
    report, study = _search(replay_recording, sqlite_url, lambda n: 100 * 0.95 ** min(n, 10) * (1 + 0.005 * (n % 2)),
                            early_stop=15)
    values = budgeted_values(study)  # a recorded failure is a budgeted trial without a value
    last_gain = values.index(min(v for v in values if v is not None))
    # The loop asks the next point while the last is measured: that one trial in hand is still run.
    assert finished_trials(study) == len(values) and last_gain + 1 + 15 <= len(values) <= last_gain + 1 + 16 < 60
    assert report.stopped_early == ((study.study_name, len(values)),)
    with open_store(sqlite_url) as store:
        stored = {r.trial_number for r in store.query_trials(TrialFilter(study=study.study_name))
                  if r.status is TrialStatus.OK}
    assert {t.number for t in study.trials if counts_toward_budget(t)} <= stored  # every trial it ran is stored


def test_an_unimproving_study_does_not_stop_before_n_trials(replay_recording, sqlite_url):
    report, study = _search(replay_recording, sqlite_url, lambda n: 100.0, early_stop=20)
    values = budgeted_values(study)
    first = next(i for i, v in enumerate(values) if v is not None)
    assert first + 1 + 20 <= len(values) <= first + 1 + 21  # the first sets the best; 20 more (+1 in hand)
    assert report.stopped_early == ((study.study_name, len(values)),)


def test_trials_stay_the_ceiling(replay_recording, sqlite_url):
    report, study = _search(replay_recording, sqlite_url, lambda n: 100 * 0.97 ** n, trials=30, early_stop=5)
    assert finished_trials(study) == 30 and report.stopped_early == ()


def test_a_resume_keeps_the_studys_early_stop_and_its_count(replay_recording, sqlite_url):
    _, study = _search(replay_recording, sqlite_url, lambda n: 100.0, trials=8, early_stop=12)
    assert finished_trials(study) == 8  # the budget ended it first
    report, study = _search(replay_recording, sqlite_url, lambda n: 100.0, trials=60, resume=True)
    values = budgeted_values(study)
    first = next(i for i, v in enumerate(values) if v is not None)
    assert first + 1 + 12 <= len(values) <= first + 1 + 13  # the stored patience, over both runs
    assert report.stopped_early == ((study.study_name, len(values)),)


def test_early_stop_must_be_positive(replay_recording, sqlite_url):
    with pytest.raises(TunerError, match="--early-stop"):
        _search(replay_recording, sqlite_url, lambda n: 100.0, early_stop=0)
