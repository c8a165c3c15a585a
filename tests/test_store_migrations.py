"""The Alembic migrations in db/: they build exactly the models, and old stores are refused."""

from __future__ import annotations

import dataclasses

import pytest
from cli_helpers import run_tuner
from sqlalchemy import text
from store_factories import H100, trial

from tuner.errors import TunerError
from tuner.store import NcuMetric, TrialFilter, open_store, store_info, upgrade_store
from tuner.store.engine import create_store_engine, current_revision, head_revision, migrate


def _diff(url: str) -> list:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from tuner.store.models import Base

    engine, _ = create_store_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()


def test_head_matches_models(store_url):
    open_store(store_url).close()
    assert _diff(store_url) == []


def test_migrations_are_reversible(store_url):
    engine, _ = create_store_engine(store_url)
    try:
        migrate(engine, "head")
        migrate(engine, "base", downgrade=True)
        with engine.connect() as conn:
            assert current_revision(conn) is None
        migrate(engine, "head")
    finally:
        engine.dispose()
    assert _diff(store_url) == []


def test_a_store_with_results_goes_down_a_revision_and_up_again_keeping_them(store_url):
    """0006 rebuilds the problems table on SQLite (trials point at it): its rows and ids survive both ways,
    and a problem with a length distribution, which 0005 cannot hold, refuses to go down."""
    from tuner.problem import Problem
    from tuner.store import TrialFilter

    with open_store(store_url) as store:
        run = store.start_run(H100)
        store.add_trial(trial(run, Problem(2, 8, 1, 512, 64)))
    engine, _ = create_store_engine(store_url)
    try:
        migrate(engine, "0005", downgrade=True)
        migrate(engine, "head")
    finally:
        engine.dispose()
    with open_store(store_url) as store:
        [row] = store.query_trials(TrialFilter())
        assert row.problem == Problem(2, 8, 1, 512, 64)
        store.add_trial(trial(run, Problem(2, 8, 1, 512, 64, lengths="uniform:16")))
    engine, _ = create_store_engine(store_url)
    try:
        with pytest.raises(Exception, match="key-length distribution cannot go back"):
            migrate(engine, "0005", downgrade=True)
    finally:
        engine.dispose()
    with open_store(store_url) as store:  # refused in one transaction: nothing lost
        assert len(store.query_trials(TrialFilter())) == 2


def _store_at(url: str, revision: str) -> None:
    engine, _ = create_store_engine(url)
    try:
        migrate(engine, revision)
    finally:
        engine.dispose()


def test_old_store_is_refused_then_upgraded(store_url):
    _store_at(store_url, "0001")
    with pytest.raises(TunerError, match=r"revision 0001.*run `tuner db upgrade`"):
        open_store(store_url)
    info = run_tuner("--db", store_url, "db", "info")
    assert info.exit_code == 0 and "outdated" in info.stdout and "0001" in info.stdout
    refused = run_tuner("--db", store_url, "results")
    assert refused.exit_code == 2 and "tuner db upgrade" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    result = run_tuner("--db", store_url, "db", "upgrade")
    assert result.exit_code == 0, result.stderr
    assert f"from revision 0001 to {head_revision()}" in result.stdout
    with open_store(store_url) as store:
        assert store.current_revision() == head_revision()
        from store_factories import H100, trial

        t = store.add_trial(trial(store.start_run(H100)))
        store.add_ncu_metrics(t, [NcuMetric("x", 1.0)])  # the table added by 0002
        assert store.query_trials(TrialFilter())[0].id == t
    again = run_tuner("--db", store_url, "db", "upgrade")
    assert again.exit_code == 0 and "already at revision" in again.stdout


def test_unknown_revision_is_refused(store_url):
    open_store(store_url).close()
    engine, _ = create_store_engine(store_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    engine.dispose()
    with pytest.raises(TunerError, match="unknown to this tuner"):
        open_store(store_url)
    with pytest.raises(TunerError, match="unknown to this tuner"):
        upgrade_store(store_url)


def test_foreign_tables_without_revision_are_refused(sqlite_url):
    engine, _ = create_store_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE trials (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(TunerError, match="without a schema revision"):
        open_store(sqlite_url)


def test_create_false_needs_an_existing_store(sqlite_url, tmp_path):
    with pytest.raises(TunerError, match="no results store"):
        open_store(sqlite_url, create=False)
    assert not (tmp_path / "results.db").exists()


def test_upgrade_store_creates_a_new_one(store_url):
    assert store_info(store_url).revision is None
    before, after = upgrade_store(store_url)
    assert (before, after) == (None, head_revision())
    assert store_info(store_url).up_to_date


def test_energy_columns_go_down_and_up_keeping_every_other_figure(store_url):
    """0007_energy adds the energy figures, isolated timings and objectives; going down drops those
    columns only (median_us means the back-to-back time in both schemas), going up again finds none."""
    from sqlalchemy import inspect

    from store_factories import baseline
    from tuner.runtime.energy import Energy
    from tuner.store import ConfirmRecord

    energy = Energy(0.35, 700.0, 1500.0)
    with open_store(store_url) as store:
        run = store.start_run(H100)
        trial_id = store.add_trial(trial(run, energy=energy, isolated_us=80.0))
        store.add_baseline(dataclasses.replace(baseline(run), energy=energy))
        store.add_confirmation(ConfirmRecord(run_id=run, problem=trial(run).problem, rounds=1, objective="energy",
                                             timings={"v": (trial_id, (100.0,))}, energy={"v": (energy,)},
                                             winner_trial_id=trial_id, winner_us=100.0, winner_ratio=1.2,
                                             baseline_impl=None, winner_joules_per_call=0.35))
    engine, _ = create_store_engine(store_url)
    try:
        migrate(engine, "0006", downgrade=True)
        columns = {t: {c["name"] for c in inspect(engine).get_columns(t)}
                   for t in ("trials", "baselines", "confirm_timings", "confirmations", "runs")}
        assert not any({"joules_per_call", "power_w", "sm_mhz", "isolated_us", "objective"} & c for c in columns.values())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT median_us FROM trials")).scalars().all() == [100.0]
            assert conn.execute(text("SELECT median_us FROM baselines")).scalars().all() == [120.0]
            assert conn.execute(text("SELECT winner_ratio FROM confirmations")).scalars().all() == [1.2]
        migrate(engine, "head")
    finally:
        engine.dispose()
    with open_store(store_url) as store:
        [row] = store.query_trials(TrialFilter())
        assert (row.median_us, row.energy, row.isolated_us) == (100.0, None, None)
        assert row.best_baseline_us == 120.0 and row.best_baseline_energy is None
        confirmed = store.confirmed(row.problem)
        assert confirmed is not None and (confirmed.objective, confirmed.joules_per_call) == ("time", None)
