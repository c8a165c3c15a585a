"""The replay backend answers from a recorded results store (SYNTHETIC recording unless tests/data has a real one)."""

from __future__ import annotations

import pytest

from tuner.backends.replay import NOT_RECORDED, ReplayBackend, recording_profile
from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store


def test_replays_recorded_results_baselines_and_card(replay_recording):
    backend = ReplayBackend(replay_recording.url, load_profile(replay_recording.profile))
    assert backend.needs_compile is False
    assert backend.device_facts().gpu_name == replay_recording.gpu_name
    with open_store(replay_recording.url, create=False) as store:
        rows = store.query_trials(TrialFilter(shape=(1, 1, 1, 1, 1)))  # nothing
        assert rows == []
        rows = [r for r in store.query_trials(TrialFilter()) if r.problem == replay_recording.problem]
    by_status = {}
    for row in rows:
        by_status.setdefault(row.status, row)
    assert TrialStatus.OK in by_status
    for status, row in by_status.items():
        if status is TrialStatus.PRUNED:
            continue
        variant = Variant.from_stored(row.template, row.params)
        m = backend.measure(replay_recording.problem, variant, None)
        assert m.status is status
        assert m.median_us == row.median_us and m.rel_error == row.rel_error and m.error == row.error
    baselines = backend.baselines(replay_recording.problem)
    assert baselines and [b.median_us for b in baselines] == sorted(b.median_us for b in baselines)
    assert backend.baselines(Problem(3, 3, 33, 33, 64)) == []


def test_a_variant_missing_from_the_recording_is_pruned_with_a_reason(replay_recording):
    backend = ReplayBackend(replay_recording.url, load_profile(replay_recording.profile))
    other = Problem(7, 3, 96, 96, replay_recording.problem.head_dim)  # never recorded
    with open_store(replay_recording.url, create=False) as store:
        row = next(r for r in store.query_trials(TrialFilter(status=TrialStatus.OK)))
    m = backend.measure(other, Variant.from_stored(row.template, row.params), None)
    assert m.status is TrialStatus.PRUNED and m.error == NOT_RECORDED and m.median_us is None


def test_a_recording_from_another_card_needs_force(replay_recording):
    other = "l4" if replay_recording.profile != "l4" else "a100"
    with pytest.raises(TunerError, match="--force"):
        ReplayBackend(replay_recording.url, load_profile(other))
    forced = ReplayBackend(replay_recording.url, load_profile(other), force=True)
    assert forced.device_facts().gpu_name == replay_recording.gpu_name


def test_auto_profile_comes_from_the_recording(replay_recording):
    assert recording_profile(replay_recording.url).name == replay_recording.profile


def test_an_empty_or_missing_recording_is_a_clear_error(tmp_path):
    with pytest.raises(TunerError, match="no results store"):
        ReplayBackend(f"sqlite:///{tmp_path / 'missing.db'}")
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_store(url).close()
    with pytest.raises(TunerError, match="holds no trials"):
        ReplayBackend(url)



def test_a_replays_own_answers_are_not_replayed_again(replay_recording, tmp_path):
    """A store that holds a replay (the README's replay writes into the default store) replays its measured runs
    only: the replay's answers would count the recording twice; a store of replays alone holds nothing to replay."""
    import shutil
    import sqlite3

    from rich.console import Console

    from tuner.search.options import SearchOptions
    from tuner.search.run import run_search

    copy = tmp_path / "with_replay.db"
    shutil.copy(replay_recording.url.removeprefix("sqlite:///"), copy)
    url, p = f"sqlite:///{copy}", replay_recording.problem
    measured = ReplayBackend(url)._run_ids
    report = run_search(SearchOptions(gpu=replay_recording.profile, db_url=url, backend="replay",
                                      replay_from=replay_recording.url, trials=5, confirm=0, dtype=p.dtype,
                                      causal=p.causal, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",)),
                        console=Console(file=None, quiet=True))
    assert report.run_ids and ReplayBackend(url)._run_ids == measured  # not the replay's run
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE runs SET replayed_from = 'sqlite:///elsewhere.db'")
    with pytest.raises(TunerError, match="holds no trials measured on a GPU"):
        ReplayBackend(url)


def test_the_committed_recording_replays_as_the_readme_says() -> None:
    """README (a) replays tests/data/replay_recording.db straight from a fresh clone: it must be at the schema
    head (after a migration: `tuner --db sqlite:///tests/data/replay_recording.db db upgrade`)."""
    import sqlalchemy

    from conftest import REPLAY_RECORDING
    from tuner.store.engine import current_revision, head_revision

    engine = sqlalchemy.create_engine(f"sqlite:///{REPLAY_RECORDING}")
    try:
        with engine.connect() as conn:
            assert current_revision(conn) == head_revision()
    finally:
        engine.dispose()
