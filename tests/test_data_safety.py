"""First run and data safety: a fresh machine, a full disk, a copied store, an old journal file.

The store is one file: Optuna's journal lives in it (tuner.search.journal),
so it is backed up, copied and recovered as one thing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from cli_helpers import run_tuner

from tuner.errors import TunerError
from tuner.search.journal import IMPORTED_SUFFIX, LEGACY_SUFFIX
from tuner.search.study import finished_trials, load_study, opened_storage
from tuner.store import TrialFilter, open_store


def _search_args(rec, db_url: str | None, trials: int, *extra: str) -> list[str]:
    p = rec.problem
    args = (["--db", db_url] if db_url else []) + [
        "search", "--gpu", rec.profile, "--shape", f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",
        "--dtype", p.dtype, "--backend", "replay", "--from", rec.url, "--trials", str(trials), "--seed", "1",
        "--study", "s"]
    return args + (["--causal"] if p.causal else []) + list(extra)


def _numbers_are_unique(db_url: str) -> None:
    with open_store(db_url, create=False) as store:
        rows = store.query_trials(TrialFilter(study="s"))
    pairs = Counter((r.study, r.trial_number) for r in rows)
    assert rows and max(pairs.values()) == 1, [p for p, n in pairs.items() if n > 1]


def test_the_first_search_on_a_fresh_machine_creates_its_store(replay_recording, tmp_path) -> None:
    """A fresh HOME, no earlier tuner command, no folder made beforehand: the README's replay command works."""
    home = tmp_path / "home"  # does not exist yet
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "XDG_"))}
    env["HOME"] = str(home)
    cmd = [sys.executable, "-m", "tuner", *_search_args(replay_recording, None, 5)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = home / ".local" / "share" / "flashcore-tuner" / "results.db"
    assert store.is_file() and not list(store.parent.glob("*journal*"))
    # The same for a --db whose folder does not exist yet.
    deep = tmp_path / "new" / "deeper" / "x.db"
    proc = subprocess.run([sys.executable, "-m", "tuner", *_search_args(replay_recording, f"sqlite:///{deep}", 5)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert deep.is_file()


def test_a_copied_store_resumes_where_it_left_off(replay_recording, tmp_path) -> None:
    first = f"sqlite:///{tmp_path / 'a.db'}"
    assert run_tuner(*_search_args(replay_recording, first, 8)).exit_code == 0
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")  # the store alone: nothing beside it to forget
    copy = f"sqlite:///{tmp_path / 'b.db'}"
    result = run_tuner(*_search_args(replay_recording, copy, 16, "--resume"))
    assert result.exit_code == 0, result.stderr
    with opened_storage(copy) as storage:
        assert finished_trials(load_study(storage, "s")) == 16
    _numbers_are_unique(copy)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (CI runs as root); skipped where this process cannot mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {exc}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(os.urandom(64 * 1024))
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_stops_the_search_with_one_line_and_the_store_resumes(replay_recording, small_disk) -> None:
    url = f"sqlite:///{small_disk / 'results.db'}"
    assert run_tuner(*_search_args(replay_recording, url, 6)).exit_code == 0
    filler = _fill(small_disk)
    full = run_tuner(*_search_args(replay_recording, url, 40, "--resume"))
    assert full.exit_code == 2, full.stderr
    lines = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and ("full" in lines[0] or "space" in lines[0]), full.stderr
    assert "Traceback" not in full.stderr
    filler.unlink()  # space is back: the same store resumes and finishes its budget
    again = run_tuner(*_search_args(replay_recording, url, 40, "--resume"))
    assert again.exit_code == 0, again.stderr
    with opened_storage(url) as storage:
        assert finished_trials(load_study(storage, "s")) == 40
    _numbers_are_unique(url)


def _legacy_journal(path: str, trials: int) -> None:
    """A journal file as stores before revision 0003 kept it, with `trials` finished trials of study 's'."""
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(path))
    study = optuna.create_study(study_name="s", storage=storage)
    for i in range(trials):
        study.add_trial(optuna.trial.create_trial(params={"x": float(i)},
                                                  distributions={"x": optuna.distributions.FloatDistribution(0, 99)},
                                                  value=float(i)))


def test_an_old_journal_file_is_imported_once_even_with_a_torn_last_record(tmp_path) -> None:
    db = tmp_path / "old.db"
    open_store(f"sqlite:///{db}").close()
    journal = str(db) + LEGACY_SUFFIX
    _legacy_journal(journal, 3)
    with open(journal, "ab") as handle:  # a record cut off by a full disk
        handle.write(b'{"op_code": 6, "worker_id": "x", "study_id": 0, "trial_id": 9, "st')
    with pytest.warns(RuntimeWarning, match="torn last record"), opened_storage(f"sqlite:///{db}") as storage:
        assert len(load_study(storage, "s").trials) == 3
    assert not os.path.exists(journal) and os.path.exists(journal + IMPORTED_SUFFIX)
    with opened_storage(f"sqlite:///{db}") as storage:  # read from the store now, not imported twice
        assert len(load_study(storage, "s").trials) == 3


def test_damage_before_the_last_record_is_refused(tmp_path) -> None:
    db = tmp_path / "old.db"
    open_store(f"sqlite:///{db}").close()
    journal = str(db) + LEGACY_SUFFIX
    _legacy_journal(journal, 2)
    lines = Path(journal).read_bytes().splitlines()
    Path(journal).write_bytes(b"\n".join([lines[0], b"{broken", *lines[1:]]) + b"\n")
    with pytest.raises(TunerError, match="is damaged"):
        with opened_storage(f"sqlite:///{db}"):
            pass
    assert os.path.exists(journal)  # nothing was consumed


def test_a_store_whose_studies_are_missing_is_refused_not_restarted(replay_recording, tmp_path) -> None:
    """An old store copied without its journal file: starting again at trial 0 would duplicate trial numbers."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert run_tuner(*_search_args(replay_recording, url, 5)).exit_code == 0
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.execute("DELETE FROM optuna_journal")
    for extra in ((), ("--resume",)):
        result = run_tuner(*_search_args(replay_recording, url, 10, *extra))
        assert result.exit_code == 2 and "holds trials of study 's'" in result.stderr, result.stderr
    _numbers_are_unique(url)


def test_resume_of_a_study_that_does_not_exist_is_refused(replay_recording, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tuner(*_search_args(replay_recording, url, 5, "--resume"))
    assert result.exit_code == 2 and "no study 's' to resume" in result.stderr, result.stderr


def test_journal_records_are_whole_json_lines(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with opened_storage(url) as storage:
        optuna.create_study(study_name=f"s-{uuid.uuid4().hex[:6]}", storage=storage)
    with sqlite3.connect(tmp_path / "j.db") as conn:
        logs = [json.loads(row[0]) for row in conn.execute("SELECT log FROM optuna_journal ORDER BY id")]
    assert logs and all(isinstance(log, dict) and "op_code" in log for log in logs)


def test_a_study_sees_what_another_storage_on_the_store_appends_in_between(tmp_path) -> None:
    """Two storages on one store (two processes' view): each read picks up the other's appends, in order,
    also after the other wrote several times between two reads (the incremental read by row id)."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with opened_storage(url) as first, opened_storage(url) as second:
        a = optuna.create_study(study_name="shared", storage=first)
        b = optuna.load_study(study_name="shared", storage=second)
        for value in range(3):
            a.add_trial(optuna.trial.create_trial(params={"x": value}, value=float(value),
                                                  distributions={"x": optuna.distributions.IntDistribution(0, 9)}))
            assert [t.params["x"] for t in b.get_trials()] == list(range(value + 1))
        for value in (7, 8):
            b.enqueue_trial({"x": value})
            b.enqueue_trial({"x": value})
        seen = [t.params.get("x", t.system_attrs.get("fixed_params", {}).get("x")) for t in a.get_trials()]
        assert seen == [0, 1, 2, 7, 7, 8, 8]
    with opened_storage(url) as fresh:  # a reader starting from line 0
        assert len(optuna.load_study(study_name="shared", storage=fresh).get_trials()) == 7


# --- several processes, SIGTERM, dead workers --------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _tuner(*args: str, delay: str = "0.05") -> subprocess.Popen:
    from tuner.backends.replay import DELAY_ENV

    env = {**os.environ, DELAY_ENV: delay, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(url: str, n: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open_store(url, create=False) as store:
                if len(store.query_trials(TrialFilter(study="s"))) >= n:
                    return
        except TunerError:  # not created yet
            pass
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} trials after {timeout_s} s")


def test_sigterm_stops_after_the_current_trial_and_ends_the_run(replay_recording, tmp_path) -> None:
    import signal

    url = f"sqlite:///{tmp_path / 'r.db'}"
    proc = _tuner(*_search_args(replay_recording, url, 200))
    try:
        _wait_for_rows(url, 5, proc)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports a process it stopped
    assert "Traceback" not in err and "continue with --resume" in err
    with opened_storage(url) as storage:
        study = load_study(storage, "s")
        assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))  # every trial was told
    with open_store(url, create=False) as store:
        [row] = store.query_trials(TrialFilter(study="s", limit=1))
        assert store.trial_detail(row.id).run_ended_at is not None  # the run was ended


def test_processes_on_one_study_share_its_budget(replay_recording, tmp_path) -> None:
    """`--resume` in three processes at once runs the study's 30 trials once, not three times."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert run_tuner(*_search_args(replay_recording, url, 30, "--trials", "1")).exit_code == 0  # budget 1 first
    procs = [_tuner(*_search_args(replay_recording, url, 30, "--resume", "--seed", str(i)), delay="0.02")
             for i in range(3)]
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    with opened_storage(url) as storage:
        assert finished_trials(load_study(storage, "s")) == 30
    _numbers_are_unique(url)


def test_a_dead_processes_trial_is_reaped_and_frees_its_budget(tmp_path) -> None:
    import time

    from tuner.search.liveness import ATTR_HEARTBEAT, ATTR_WORKER, STALE_S, abandoned, budget_taken, reap

    with opened_storage(f"sqlite:///{tmp_path / 'r.db'}") as storage:
        study = optuna.create_study(study_name="s", storage=storage)
        gone, alive = study.ask(), study.ask()
        for trial, beat in ((gone, time.time() - STALE_S - 5), (alive, time.time())):
            trial.set_user_attr(ATTR_WORKER, "another-host:1234")  # not this host: only the heartbeat tells
            trial.set_user_attr(ATTR_HEARTBEAT, beat)
        running = {t.number: t for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))}
        assert abandoned(running[gone.number]) and not abandoned(running[alive.number])
        assert budget_taken(study) == 1
        assert reap(study) == [gone.number]
        states = {t.number: t.state for t in study.get_trials()}
        assert states[gone.number] == optuna.trial.TrialState.FAIL
        assert states[alive.number] == optuna.trial.TrialState.RUNNING
        assert budget_taken(study) == 1  # a reaped trial is marked interrupted: it does not count


# --- readers change nothing -----------------------------------------------------------------------


def test_db_info_creates_nothing(tmp_path) -> None:
    target = tmp_path / "a" / "b" / "x.db"
    result = run_tuner("db", "info", "--db", f"sqlite:///{target}")
    assert result.exit_code == 0 and "created on first use" in result.stdout, result.stderr
    assert not (tmp_path / "a").exists()


def test_a_foreign_sqlite_file_is_refused_untouched(tmp_path) -> None:
    foreign = tmp_path / "notes.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    before = foreign.read_bytes()
    result = run_tuner("results", "--db", f"sqlite:///{foreign}")
    assert result.exit_code == 2 and "holds no tuner tables" in result.stderr, result.stderr
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    assert foreign.read_bytes() == before and not list(tmp_path.glob("notes.db-*"))


def test_a_store_on_read_only_media_can_be_read(replay_recording, small_disk) -> None:
    url = f"sqlite:///{small_disk / 'r.db'}"
    assert run_tuner(*_search_args(replay_recording, url, 5)).exit_code == 0
    conn = sqlite3.connect(small_disk / "r.db")  # as a copy to an archive would be: complete
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, timeout=30)
    if remount.returncode:
        pytest.skip(f"cannot remount read-only: {remount.stderr.decode().strip()}")
    listed = run_tuner("results", "--db", url, "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    assert len(json.loads(listed.stdout)) >= 5
    info = run_tuner("db", "info", "--db", url)
    assert info.exit_code == 0 and "up to date" in info.stdout, info.stderr
