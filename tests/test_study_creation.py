"""A study's first moments under faults: the Optuna storage's first use by several processes at once,
a kill between creating a study and writing its attributes, and a start that meets a study being created.

Real processes throughout (issue 36, items 1-3): the faults were found with kill -9 and concurrent starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


# --- the Optuna storage's first use on PostgreSQL ---------------------------------------------------

# Opens the Optuna storage of a fresh database. Optuna's table creation checks which tables exist, then
# creates the missing ones; this child waits there (MetaData's before_create, fired after the check and
# before the first CREATE) until every child has checked, or 3 s: without serialisation they all found
# no table and all create them, so all but one collide; serialised, the later ones find every table and
# have nothing to create.
FIRST_USE = """
    import os, sys, time
    from pathlib import Path
    from optuna.storages._rdb import models
    from sqlalchemy import event

    arrived = Path(sys.argv[2])

    @event.listens_for(models.BaseModel.metadata, "before_create")
    def _wait_for_the_others(_metadata, _conn, tables=(), **_kw):
        if not tables:
            return
        (arrived / str(os.getpid())).touch()
        deadline = time.monotonic() + 3.0
        while len(list(arrived.iterdir())) < int(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.01)

    from tuner.search.study import opened_storage
    with opened_storage(sys.argv[1]):
        pass
"""


@pytest.mark.postgres
@pytest.mark.parametrize("first", ["search", "db upgrade"])
def test_first_use_of_a_postgres_store_by_several_processes_at_once(pg_url, tmp_path, first):
    """Every process opens the storage (Optuna's table creation is serialised by an advisory lock), also
    after `tuner db upgrade` alone, which now creates Optuna's tables too."""
    if first == "db upgrade":
        from tuner.store import upgrade_store

        upgrade_store(pg_url)
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    count = 3
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(FIRST_USE), pg_url, str(arrived), str(count)],
                                 cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(count)]
    results = [(child.wait(timeout=120), child.stderr.read()) for child in children]
    for child in children:
        child.stdout.close()
        child.stderr.close()
    assert [rc for rc, _ in results] == [0] * count, "\n".join(err[-1500:] for _, err in results)
    if first == "db upgrade":  # the tables were there: nobody had anything to create
        assert list(arrived.iterdir()) == []


# --- a kill between creating a study and writing its attributes -----------------------------------

from optuna.trial import TrialState  # noqa: E402

from tuner.search.study import (  # noqa: E402
    ATTR_BUDGET,
    ATTR_PROFILE,
    ATTR_TEMPLATE,
    finished_trials,
    opened_storage,
    study_info,
)

# `tuner search` that stops at its first write of study attribute STOP_AT (Optuna's Study.set_user_attr,
# right after the study's creation): killed there (STOP=kill), or waiting until the file GO exists after
# creating the file HELD (STOP=hold), as a creator a second start meets mid-creation.
STOPPED_CREATING = """
    import os, signal, sys, time
    from pathlib import Path
    import optuna

    original = optuna.Study.set_user_attr

    def set_user_attr(self, key, value):
        if key == os.environ["STOP_AT"] and not os.environ.get("STOPPED"):
            os.environ["STOPPED"] = "1"
            if os.environ["STOP"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            Path(os.environ["HELD"]).touch()
            deadline = time.monotonic() + 120
            while not Path(os.environ["GO"]).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return original(self, key, value)

    optuna.Study.set_user_attr = set_user_attr
    from tuner.cli.app import main
    sys.argv = ["tuner", *sys.argv[1:]]
    main()
"""

BUDGET = 4


def _search_args(rec, db_url: str, *extra: str) -> list[str]:
    p = rec.problem
    args = ["--db", db_url, "search", "--gpu", rec.profile, "--shape",
            f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}", "--dtype", p.dtype, "--backend", "replay",
            "--from", rec.url, "--trials", str(BUDGET), "--seed", "3", "--confirm", "0", *extra]
    return args + (["--causal"] if p.causal else [])


def _stopped_creating(rec, db_url: str, stop: str, at: str, tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = _env(STOP=stop, STOP_AT=at, HELD=str(tmp_path / "held"), GO=str(tmp_path / "go"))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(STOPPED_CREATING), *_search_args(rec, db_url, *extra)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _only_study(db_url: str):
    import optuna

    with opened_storage(db_url) as storage:
        [summary] = optuna.get_all_study_summaries(storage)
        return optuna.load_study(study_name=summary.study_name, storage=storage)


def _check_finished(db_url: str, rec) -> None:
    study = _only_study(db_url)
    info = study_info(study)
    assert (info.problem, info.profile, info.budget) == (rec.problem, rec.profile, BUDGET)
    assert finished_trials(study) == BUDGET
    assert not study.get_trials(states=(TrialState.RUNNING,))


@pytest.mark.parametrize("killed_at, then", [("problem", "--resume"), ("problem", "plain"),
                                             (ATTR_BUDGET, "plain"), (ATTR_TEMPLATE, "--resume")])
def test_a_study_killed_before_its_attributes_were_written_is_completed_by_the_next_start(
        replay_recording, store_url, tmp_path, killed_at, then):
    """Killed right after creating the study (no attribute, or some): the next start, plain or --resume,
    completes it and runs the budget; it used to refuse both for good."""
    from cli_helpers import run_tuner

    killed = _stopped_creating(replay_recording, store_url, "kill", killed_at, tmp_path)
    _out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, err[-2000:]
    assert ATTR_BUDGET not in _only_study(store_url).user_attrs

    again = run_tuner(*_search_args(replay_recording, store_url, *(["--resume"] if then == "--resume" else [])))
    assert again.exit_code == 0, again.stderr
    _check_finished(store_url, replay_recording)
    assert _only_study(store_url).user_attrs[ATTR_PROFILE] == replay_recording.profile


# --- a start that meets a study its creator has not finished ------------------------------------------


def test_a_resume_that_meets_a_study_mid_creation_completes_it_and_both_finish(replay_recording, store_url, tmp_path):
    """Two `--resume` starts: the second loads the study while the first holds between creating it and writing
    its attributes. It used to die ("was not created by `tuner search`"); now it completes the study and
    runs, the first goes on, and the study's budget holds for both."""
    from cli_helpers import run_tuner

    first = _stopped_creating(replay_recording, store_url, "hold", "problem", tmp_path, "--resume")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "held").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.05)
        second = run_tuner(*_search_args(replay_recording, store_url, "--resume"))
        assert second.exit_code == 0, second.stderr
    finally:
        (tmp_path / "go").touch()
        _out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    _check_finished(store_url, replay_recording)


def test_a_start_that_loses_the_race_to_create_a_study_completes_it(replay_recording, sqlite_url, monkeypatch):
    """Both starts found no study and both created it: the one whose creation Optuna refuses as a duplicate
    loads the study the other created (mid-creation here) and completes it, instead of a traceback."""
    import optuna

    from cli_helpers import run_tuner
    from tuner.search import prepare

    args = _search_args(replay_recording, sqlite_url, "--resume")
    with opened_storage(sqlite_url) as storage:  # the other start's creation, its attributes not written yet
        optuna.create_study(study_name=prepare.study_name(replay_recording.profile, "attn_fwd_mma",
                                                          replay_recording.problem, "time"), storage=storage)
    monkeypatch.setattr(prepare, "study_exists", lambda _storage, _name: False)  # looked before it was there
    result = run_tuner(*args, "--template", "attn_fwd_mma")
    assert result.exit_code == 0, result.stderr
    _check_finished(sqlite_url, replay_recording)
