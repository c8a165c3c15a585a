"""The Alembic migrations in db/: they build exactly the models, and old stores are refused."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run_tuner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, text
from store_factories import H100, trial

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.store import ConfirmRecord, NcuMetric, TrialFilter, open_store, store_info, upgrade_store
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
        with pytest.raises(TunerError, match="cannot go back to revision 0005: .*key-length distribution"):
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


# --- downgrades never delete data -----------------------------------------------------------------

# Data a store can hold, and the revision that brought each in: going below it would delete the data.
SINCE = {"trials": "0001", "ncu": "0002", "journal": "0003", "replayed": "0004", "confirmations": "0005",
         "ragged": "0006", "energy": "0007", "windows": "0008", "fp8": "0009", "fp8_kv": "0010",
         "packed": "0011", "backward": "0012"}
NAMED = {"trials": "trials", "ncu": "ncu metrics", "journal": "Optuna journal records",
         "replayed": "runs.replayed_from", "confirmations": "confirmations", "ragged": "key-length distribution",
         "energy": "energy or isolated figures of trials", "windows": "problems with a sliding window or a softcap",
         "fp8": "problems in e4m3", "fp8_kv": "problems with an FP8 KV cache",
         "packed": "problems of packed sequences", "backward": "problems of the backward pass"}
FP8 = Problem(2, 8, 256, 256, 128, dtype="e4m3", heads_kv=2)
FP8_KV = Problem(8, 32, 1, 8192, 128, dtype="bf16_kv_e4m3", heads_kv=8)
BACKWARD = Problem(8, 16, 2048, 2048, 128, dtype="bf16", kernel_pass="backward")
PACKED = Problem(16, 32, 4096, 4096, 128, dtype="bf16", causal=True, heads_kv=8, layout="packed", lengths="uniform:64")


def _fill(url: str, kinds: set[str]) -> None:
    """A store at head holding the given kinds of data (some kinds bring trials along)."""
    with open_store(url) as store:
        if kinds & {"trials", "ncu", "confirmations"}:
            run = store.start_run(H100)
            t = store.add_trial(trial(run))
            if "ncu" in kinds:
                store.add_ncu_metrics(t, [NcuMetric("sm__throughput", 71.5, "%")])
            if "confirmations" in kinds:
                store.add_confirmation(ConfirmRecord(run_id=run, problem=trial(run).problem, rounds=2,
                                                     timings={"v": (t, (1.0, 1.1)), "sdpa": (None, (1.2, 1.3))},
                                                     winner_trial_id=t, winner_us=1.05, winner_ratio=1.1,
                                                     baseline_impl="sdpa"))
        if "replayed" in kinds:
            store.start_run(replace(H100, replayed_from="sqlite:///recorded.db"))
        if "energy" in kinds:
            from tuner.runtime.energy import Energy

            store.add_trial(trial(store.start_run(H100), energy=Energy(0.35, 700.0, 1500.0)))
        if "ragged" in kinds:
            store.add_trial(trial(store.start_run(H100), Problem(2, 8, 1, 512, 64, lengths="uniform:16")))
        if "windows" in kinds:
            store.add_trial(trial(store.start_run(H100), Problem(1, 8, 512, 512, 64, window_left=128)))
        if "fp8" in kinds:
            store.add_trial(trial(store.start_run(H100), FP8))
        if "fp8_kv" in kinds:
            store.add_trial(trial(store.start_run(H100), FP8_KV))
        if "packed" in kinds:
            store.add_trial(trial(store.start_run(H100), PACKED))
        if "backward" in kinds:
            store.add_trial(trial(store.start_run(H100), BACKWARD))
        if "journal" in kinds:  # a SQLite store's Optuna studies
            store.append_journal(['{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}'])


def _contents(url: str) -> dict[str, list]:
    """Every row of every table but alembic's (ordered), to compare a store before and after."""
    engine, _ = create_store_engine(url)
    try:
        with engine.connect() as conn:
            tables = sorted(set(inspect(conn).get_table_names()) - {"alembic_version"})
            return {name: sorted(map(tuple, conn.execute(text(f"SELECT * FROM {name}"))), key=repr)
                    for name in tables}
    finally:
        engine.dispose()


def _migrate(url: str, target: str, downgrade: bool = False) -> None:
    engine, _ = create_store_engine(url)
    try:
        migrate(engine, target, downgrade=downgrade)
    finally:
        engine.dispose()


def test_going_back_to_0001_refuses_to_delete_the_journal_and_the_later_tables(store_url):
    """The issue's case: down to 0001 and up again used to drop the journal, the confirm stage, the ncu
    metrics and runs.replayed_from without a word. Refused in one line naming each; nothing changes."""
    _fill(store_url, {"ncu", "journal", "replayed", "confirmations"})
    before = _contents(store_url)
    with pytest.raises(TunerError) as refused:
        _migrate(store_url, "0001", downgrade=True)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the results store cannot go back to revision 0001")
    for kind in ("ncu", "journal", "replayed", "confirmations"):
        assert NAMED[kind] in message
    assert "Optuna journal records (1)" in message and "nothing was changed" in message
    assert store_info(store_url).revision == head_revision()
    assert _contents(store_url) == before


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.sets(st.sampled_from(sorted(SINCE))),
       target=st.sampled_from(["base", "0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008"]))
def test_a_downgrade_goes_through_exactly_when_it_deletes_nothing(kinds: set[str], target: str) -> None:
    """Refused, changing nothing, iff some data came in with a revision above the target; otherwise the
    store goes down and back up with every row as it was."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'results.db'}"
        _fill(url, kinds)
        before = _contents(url)
        lost = {kind for kind in kinds if target == "base" or SINCE[kind] > target}
        if lost:
            with pytest.raises(TunerError) as refused:
                _migrate(url, target, downgrade=True)
            assert all(NAMED[kind] in str(refused.value) for kind in lost), str(refused.value)
            assert store_info(url).revision == head_revision()
        else:
            _migrate(url, target, downgrade=True)
            assert store_info(url).revision == (None if target == "base" else target)
            _migrate(url, "head")
        assert _contents(url) == before


def test_each_migration_refuses_its_own_losses_when_run_without_migrate(sqlite_url):
    """`alembic downgrade` (development, db/env.py) skips migrate()'s check: each downgrade() refuses itself."""
    from alembic import command

    from tuner.store.engine import alembic_config

    _fill(sqlite_url, {"confirmations"})
    before = _contents(sqlite_url)
    engine, _ = create_store_engine(sqlite_url)
    try:
        with pytest.raises(TunerError, match=r"revision 0004: .*confirmations \(1\), confirm timings \(4\)"):
            with engine.connect() as conn:
                conn.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")  # as migrate() does
                with conn.begin():
                    command.downgrade(alembic_config(conn), "0004")
    finally:
        engine.dispose()
    assert store_info(sqlite_url).revision == head_revision() and _contents(sqlite_url) == before
def test_energy_figures_refuse_a_downgrade_and_a_store_without_them_goes_down_and_up(store_url):
    """0007 adds the energy figures, isolated timings and objectives. A store holding any of them refuses
    to go below 0007, naming them; one without them goes down (median_us means the back-to-back time in
    both schemas) and up again with every other figure as it was."""
    from store_factories import baseline
    from tuner.runtime.energy import Energy

    energy = Energy(0.35, 700.0, 1500.0)
    with open_store(store_url) as store:
        run = store.start_run(H100)
        plain = store.add_trial(trial(run))
        store.add_baseline(baseline(run))
    _migrate(store_url, "0006", downgrade=True)
    engine, _ = create_store_engine(store_url)
    try:
        columns = {t: {c["name"] for c in inspect(engine).get_columns(t)}
                   for t in ("trials", "baselines", "confirm_timings", "confirmations", "runs")}
        assert not any({"joules_per_call", "power_w", "sm_mhz", "isolated_us", "objective"} & c for c in columns.values())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT median_us FROM trials")).scalars().all() == [100.0]
            assert conn.execute(text("SELECT median_us FROM baselines")).scalars().all() == [120.0]
    finally:
        engine.dispose()
    _migrate(store_url, "head")
    with open_store(store_url) as store:
        [row] = store.query_trials(TrialFilter())
        assert (row.id, row.median_us, row.energy, row.isolated_us) == (plain, 100.0, None, None)
        run = store.start_run(H100)
        trial_id = store.add_trial(trial(run, energy=energy, isolated_us=80.0))
        store.add_baseline(baseline(run, energy=energy))
        store.add_confirmation(ConfirmRecord(run_id=run, problem=trial(run).problem, rounds=1, objective="energy",
                                             timings={"v": (trial_id, (100.0,))}, energy={"v": (energy,)},
                                             winner_trial_id=trial_id, winner_us=100.0, winner_ratio=1.2,
                                             baseline_impl=None, winner_joules_per_call=0.35))
    before = _contents(store_url)
    with pytest.raises(TunerError) as refused:
        _migrate(store_url, "0006", downgrade=True)
    message = str(refused.value)
    for what in ("energy or isolated figures of trials (1)", "energy or isolated figures of baselines (1)",
                 "energy or isolated figures of confirm_timings (1)", "confirm stages of another objective"):
        assert what in message, message
    assert store_info(store_url).revision == head_revision() and _contents(store_url) == before


def test_e4m3_problems_refuse_a_downgrade_below_0009_and_a_store_without_them_goes_down_and_up(store_url):
    """0009 only marks the stores that may hold e4m3 problems, which a tuner of 0008 cannot read: a store
    holding one refuses to go below it, naming them, and changes nothing; one without goes down and up."""
    with open_store(store_url) as store:
        run = store.start_run(H100)
        plain = store.add_trial(trial(run, Problem(2, 8, 256, 256, 128, dtype="bf16", heads_kv=2)))
    before = _contents(store_url)
    _migrate(store_url, "0008", downgrade=True)
    assert store_info(store_url).revision == "0008"
    _migrate(store_url, "head")
    assert _contents(store_url) == before
    with open_store(store_url) as store:
        fp8 = store.add_trial(trial(store.start_run(H100), FP8))
        rows = {r.id: r.problem for r in store.query_trials(TrialFilter())}
    assert rows == {plain: Problem(2, 8, 256, 256, 128, dtype="bf16", heads_kv=2), fp8: FP8}
    before = _contents(store_url)
    with pytest.raises(TunerError) as refused:
        _migrate(store_url, "0008", downgrade=True)
    message = str(refused.value)
    assert message == ("the results store cannot go back to revision 0008: that would delete problems in e4m3, which "
                       "an older tuner cannot read (problems.dtype) (1); nothing was changed")
    assert store_info(store_url).revision == head_revision() and _contents(store_url) == before
