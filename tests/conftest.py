"""Shared fixtures. Store fixtures: a fresh results store per test on every backend.

PostgreSQL cases run when TUNER_TEST_PG_URL points to a server where that role
may create databases (CREATEDB), e.g.
postgresql://tuner:tuner@127.0.0.1:55432/tuner_test; each test gets its own
database, dropped afterwards. Otherwise they are skipped with the reason.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator, Optional

import pytest

PG_ENV = "TUNER_TEST_PG_URL"
_pg_checked: dict[str, Optional[str]] = {}


def _pg_admin_engine(url: str):
    from sqlalchemy import create_engine

    from tuner.store.engine import _parse

    return create_engine(_parse(url), isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


def pg_skip_reason() -> Optional[str]:
    """None when TUNER_TEST_PG_URL is set and reachable, else why the postgres cases are skipped."""
    url = os.environ.get(PG_ENV)
    if not url:
        return f"{PG_ENV} is not set (e.g. postgresql://tuner:tuner@127.0.0.1:55432/tuner_test)"
    if url not in _pg_checked:
        from tuner.store.redact import redact_url

        try:
            engine = _pg_admin_engine(url)
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            engine.dispose()
            _pg_checked[url] = None
        except Exception as exc:  # any failure: skip, saying why (password hidden)
            first = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            _pg_checked[url] = f"PostgreSQL at {redact_url(url)} unreachable: {first}"
    return _pg_checked[url]


def _fresh_pg_database() -> Iterator[str]:
    from sqlalchemy.engine import make_url

    base = os.environ[PG_ENV]
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_engine(base)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'")
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_pg_database(admin, name)
        admin.dispose()


def _drop_pg_database(admin, name: str) -> None:
    """Drop a test database, ending what is still connected to it.

    Not DROP ... WITH (FORCE): PostgreSQL refuses it (42501) to a role without
    pg_signal_backend while an autovacuum worker is in the database (the worker
    belongs to no role). The role ends its own leaked sessions instead, and a plain
    DROP stops autovacuum workers itself (waiting up to 5 s for sessions to end)."""
    with admin.connect() as conn:
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %(name)s AND usename = current_user AND pid <> pg_backend_pid()",
            {"name": name},
        )
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(autouse=True, scope="session")
def _baseline_log_in_a_temporary_folder(tmp_path_factory) -> None:
    """Warnings of baselines (tuner.runtime.baseline_log) go to a test folder, never the user's log."""
    os.environ.setdefault("TUNER_LOG_DIR", str(tmp_path_factory.mktemp("logs")))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """URL of an empty database on each backend (nothing created in it yet)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    reason = pg_skip_reason()
    if reason:
        pytest.skip(reason)
    yield from _fresh_pg_database()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


@pytest.fixture
def store(store_url: str):
    """An open store at schema head on each backend."""
    from tuner.store import open_store

    with open_store(store_url) as opened:
        yield opened


# =============================================================================
# Search / replay fixtures (owner: search)
#
# `replay_recording`: a results store to replay (tuner search --backend replay
# --from URL). REPLAY_RECORDING is a real recording: a grid search of
# B1 H8 S512 D64 fp16 on an NVIDIA H200 (2026-11-26; 1343 of the 1500 feasible
# variants measured ok, pruned rows and compile logs stripped; its variants got
# LAZY_RESCALE=false when that parameter was added, which is the code they ran
# with). Without it the
# tests build a SYNTHETIC one (made-up timings, tuner/replay_fixture.py).
# `pg_url`: a fresh PostgreSQL database, or a skip that says why.
# =============================================================================

from dataclasses import dataclass as _search_dataclass
from pathlib import Path as _SearchPath

REPLAY_RECORDING = _SearchPath(__file__).parent / "data" / "replay_recording.db"


@_search_dataclass(frozen=True)
class Recording:
    url: str
    problem: "object"  # tuner.problem.Problem with the most replayable trials
    profile: str  # GPU profile of the recording's run
    gpu_name: str
    replayable: int  # variants of `problem` with a recorded ok/incorrect/launch_error/timeout result
    synthetic: bool


@pytest.fixture(scope="session")
def replay_recording(tmp_path_factory) -> Recording:
    from collections import Counter

    from tuner.problem import Problem
    from tuner.status import TrialStatus
    from tuner.store import TrialFilter, open_store

    if REPLAY_RECORDING.exists():
        import shutil

        from tuner.store import upgrade_store

        copy = tmp_path_factory.mktemp("recording") / REPLAY_RECORDING.name  # never write to the committed file
        shutil.copy(REPLAY_RECORDING, copy)
        url, synthetic = f"sqlite:///{copy}", False
        upgrade_store(url)  # the committed file stays at the revision it was recorded with
    else:
        from tuner.backends.synthetic import write_synthetic_recording

        url, synthetic = f"sqlite:///{tmp_path_factory.mktemp('recording') / 'synthetic.db'}", True
        write_synthetic_recording(url, [Problem(1, 8, 512, 512, 64)], profile="h100")
    with open_store(url, create=False) as store:
        rows = [r for r in store.query_trials(TrialFilter()) if r.status is not TrialStatus.PRUNED]
    counts = Counter((r.problem, r.profile, r.gpu_name) for r in rows)
    (problem, profile, gpu_name), n = counts.most_common(1)[0]
    variants = {tuple(sorted(r.params.items())) for r in rows if r.problem == problem and r.gpu_name == gpu_name}
    return Recording(url, problem, profile, gpu_name, len(variants), synthetic)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (dropped afterwards), or a skip naming the reason."""
    reason = pg_skip_reason()
    if reason:
        pytest.skip(reason)
    yield from _fresh_pg_database()


# =============================================================================
# TUNER_REQUIRE_PG (owner: CI / profiles engineer; keep this block last)
#
# With TUNER_REQUIRE_PG=1 (set by .ci/run) a PostgreSQL test that would be
# skipped -- no TUNER_TEST_PG_URL, server unreachable, driver missing --
# fails instead, so CI cannot pass without having run them. A test counts
# as a PostgreSQL test when it carries the `postgres` marker, its node id
# names postgres (e.g. a backend parameter), or the skip reason does.
# =============================================================================

import os as _require_pg_os

import pytest as _require_pg_pytest


def _require_pg_enabled() -> bool:
    return _require_pg_os.environ.get("TUNER_REQUIRE_PG", "").strip().lower() in ("1", "true", "yes", "on")


def _is_postgres_skip(item, report) -> bool:
    if item.get_closest_marker("postgres") is not None:
        return True
    reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    text = f"{item.nodeid} {reason}".lower()
    return any(word in text for word in ("postgres", "tuner_test_pg_url", "psycopg"))


@_require_pg_pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (_require_pg_enabled() and report.skipped and _is_postgres_skip(item, report)):
        return
    if hasattr(report, "wasxfail"):  # an expected failure is not a skip
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = (
        f"TUNER_REQUIRE_PG=1 but this PostgreSQL test was skipped: {reason}\n"
        "Set TUNER_TEST_PG_URL to a reachable database (postgresql://user:password@host:port/db), "
        "or unset TUNER_REQUIRE_PG."
    )


def pytest_report_header(config):
    if _require_pg_enabled():
        url = _require_pg_os.environ.get("TUNER_TEST_PG_URL")
        return f"TUNER_REQUIRE_PG=1: PostgreSQL tests must run ({'TUNER_TEST_PG_URL set' if url else 'TUNER_TEST_PG_URL NOT set'})"
    return None
