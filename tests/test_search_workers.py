"""Searches across processes: kill -9 then --resume, several workers on one study (SQLite+journal, PostgreSQL),
and `tuner worker` joining a study. Replay backend (SYNTHETIC recording unless tests/data holds a real one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from cli_helpers import run_tuner
from hypothesis import given
from hypothesis import strategies as st

from tuner.backends.replay import DELAY_ENV
from tuner.search.samplers import study_name
from tuner.search.study import finished_trials, storage_for
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

ROOT = Path(__file__).resolve().parents[1]


def search_args(rec, db_url: str, trials: int, *extra: str) -> list[str]:
    p = rec.problem
    args = ["--db", db_url, "search", "--gpu", rec.profile, "--shape",
            f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}", "--dtype", p.dtype, "--backend", "replay",
            "--from", rec.url, "--trials", str(trials), *extra]
    return args + (["--causal"] if p.causal else [])


def trials_of(db_url: str):
    with open_store(db_url) as store:
        return store.query_trials(TrialFilter())


def assert_no_variant_measured_twice(rows) -> None:
    # Keyed by template hash too: an edited template is another kernel, rightly measured again.
    measured = Counter((r.variant_name, r.template_hash) for r in rows if r.status is not TrialStatus.PRUNED)
    assert measured and max(measured.values()) == 1, measured.most_common(3)


def the_study(rec, db_url: str) -> optuna.Study:
    return optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                             storage=storage_for(db_url))


def test_kill_9_loses_no_completed_trial_and_resume_finishes_the_budget(replay_recording, sqlite_url):
    rec = replay_recording
    env = {**os.environ, DELAY_ENV: "0.05", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *search_args(rec, sqlite_url, 60, "--seed", "1")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Path(sqlite_url[len("sqlite:///"):]).exists() and len(trials_of(sqlite_url)) >= 8:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = {r.id: r for r in trials_of(sqlite_url)}
    assert proc.returncode == -signal.SIGKILL and len(before) >= 8
    study = the_study(rec, sqlite_url)
    done = finished_trials(study)
    assert 0 < done < 60
    result = run_tuner(*search_args(rec, sqlite_url, 60, "--resume"))
    assert result.exit_code == 0, result.stderr
    after = {r.id: r for r in trials_of(sqlite_url)}
    for trial_id, row in before.items():  # every trial committed before the kill is still there, unchanged
        assert after[trial_id] == row
    assert finished_trials(the_study(rec, sqlite_url)) == 60
    assert_no_variant_measured_twice(after.values())


def _two_workers(rec, db_url: str) -> None:
    env = {DELAY_ENV: "0.01"}
    result = run_tuner(*search_args(rec, db_url, 40, "--devices", "0,1", "--seed", "2"), env=env)
    assert result.exit_code == 0, result.stderr
    rows = trials_of(db_url)
    assert_no_variant_measured_twice(rows)
    assert len({r.run_id for r in rows}) == 2  # one run per device, both worked
    study = the_study(rec, db_url)
    assert finished_trials(study) == 40
    assert "search summary" in result.stdout


def test_two_workers_share_one_study_on_sqlite(replay_recording, sqlite_url):
    _two_workers(replay_recording, sqlite_url)


@pytest.mark.postgres
def test_two_workers_share_one_study_on_postgres(replay_recording, pg_url):
    _two_workers(replay_recording, pg_url)
    storage = storage_for(pg_url)
    assert isinstance(storage, optuna.storages.RDBStorage)


@pytest.mark.postgres
def test_a_worker_joins_a_study_from_another_host(replay_recording, pg_url):
    rec = replay_recording
    first = run_tuner(*search_args(rec, pg_url, 15, "--seed", "4"))
    assert first.exit_code == 0, first.stderr
    name = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    # The worker finds problem, template and GPU profile in the study; results go to the same database.
    joined = run_tuner("worker", "--study", name, "--storage", pg_url, "--backend", "replay", "--from", rec.url,
                       "--trials", "10")
    assert joined.exit_code == 0, joined.stderr
    assert finished_trials(the_study(rec, pg_url)) == 25
    rows = trials_of(pg_url)
    assert len({r.run_id for r in rows}) == 2
    assert_no_variant_measured_twice(rows)
    missing = run_tuner("worker", "--study", "nope", "--storage", pg_url, "--backend", "replay", "--from", rec.url)
    assert missing.exit_code == 2 and "no study named 'nope'" in missing.stderr


def test_a_worker_for_a_store_that_does_not_exist_creates_nothing(replay_recording, tmp_path):
    rec = replay_recording
    where = tmp_path / "none" / "a.db"
    res = run_tuner("worker", "--study", "nope", "--storage", f"sqlite:///{where}", "--backend", "replay", "--from",
                    rec.url)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert str(where) in res.stderr and not (tmp_path / "none").exists()


def test_sigint_stops_after_the_current_trial_and_exits_130(replay_recording, sqlite_url):
    rec = replay_recording
    env = {**os.environ, DELAY_ENV: "0.05", "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *search_args(rec, sqlite_url, 200, "--seed", "6")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Path(sqlite_url[len("sqlite:///"):]).exists() and len(trials_of(sqlite_url)) >= 5:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert "stopping after the current trial" in err.decode() and "search summary" in out.decode()
    study = the_study(rec, sqlite_url)
    rows = trials_of(sqlite_url)
    stored_numbers = {r.trial_number for r in rows}
    # Every trial Optuna knows as finished is in the store (or was served from it); none is left running.
    finished = [t for t in study.trials if t.state.is_finished()]
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert all(t.number in stored_numbers or t.user_attrs.get("source") == "store" or t.user_attrs.get("interrupted")
               for t in finished)
    assert finished_trials(study) < 200


# --- worker processes: collecting their events, a failing worker, Ctrl-C ---


class FakeQueue:
    """Scripted events; EMPTY in the script makes one get() time out."""

    EMPTY = object()

    def __init__(self, script) -> None:
        self.script = list(script)

    def get(self, timeout=None):
        import queue

        if not self.script or self.script[0] is self.EMPTY:
            if self.script:
                self.script.pop(0)
            raise queue.Empty
        return self.script.pop(0)

    def get_nowait(self):
        return self.get()


class FakeProc:
    def __init__(self, alive, exitcode: int = 0) -> None:
        self.alive, self.code = alive, exitcode
        self.terminated = self.killed = False

    def is_alive(self) -> bool:
        return self.alive()

    @property
    def exitcode(self):
        return None if self.alive() else self.code

    def terminate(self) -> None:
        self.terminated = True

    def kill(self) -> None:
        self.killed = True


def test_one_failing_worker_stops_the_others_and_their_events_are_drained():
    import threading

    from tuner.search.job import WorkerResult
    from tuner.search.worker_processes import collect

    done0 = WorkerResult(run_id=1, measured=2)
    events = FakeQueue([("trial", 0, 1.0), ("error", 1, "boom"), FakeQueue.EMPTY, ("trial", 0, 2.0),
                        FakeQueue.EMPTY, ("trial", 0, None), ("done", 0, done0)])
    stop, seen = threading.Event(), []

    def handle(event):
        if event[2] == 2.0:
            assert stop.is_set()  # the error stopped the others at once
        seen.append(event)

    # Worker 0 runs until its last event is read (a child cannot exit before its queue is flushed).
    workers = [(0, 0, FakeProc(lambda: bool(events.script))), (1, 1, FakeProc(lambda: False, 1))]
    results, errors = collect(events, workers, handle, stop, poll_s=0)
    assert errors == ["boom"] and stop.is_set()
    assert seen == [("trial", 0, 1.0), ("trial", 0, 2.0), ("trial", 0, None)] and not events.script
    assert results[0] is done0 and results[1].interrupted


def test_a_worker_that_dies_silently_is_an_error_but_a_late_result_is_not():
    import threading

    from tuner.search.job import WorkerResult
    from tuner.search.worker_processes import collect

    late = WorkerResult(run_id=3)
    # Worker 0 exited normally, its "done" still in the pipe when the first get() timed out.
    events = FakeQueue([FakeQueue.EMPTY, ("done", 0, late)])
    stop = threading.Event()
    workers = [(0, 0, FakeProc(lambda: False, 0)), (1, 5, FakeProc(lambda: False, -9))]
    results, errors = collect(events, workers, lambda e: None, stop, poll_s=0)
    assert results[0] is late
    assert errors == ["worker on device 5 died (exit code -9)"] and results[1].interrupted and stop.is_set()


def test_ctrl_c_in_the_parent_stops_then_terminates_then_kills_the_children():
    import threading

    from tuner.search.worker_processes import EscalateOnSigint

    flag, said = threading.Event(), []
    running, exited = FakeProc(lambda: True), FakeProc(lambda: False)
    sigint = EscalateOnSigint(flag, [running, exited], said.append)
    sigint._handler(signal.SIGINT, None)
    assert flag.is_set() and not running.terminated and not sigint.aborted
    assert "stopping after the current trial" in said[0]
    sigint._handler(signal.SIGINT, None)
    assert running.terminated and not exited.terminated and sigint.aborted and not running.killed
    sigint._handler(signal.SIGINT, None)
    assert running.killed


def test_a_worker_process_that_fails_ends_the_search_without_waiting_for_the_others(replay_recording, sqlite_url,
                                                                                     tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from tuner.errors import TunerError
    from tuner.search.job import WorkerJob
    from tuner.search.options import SearchOptions
    from tuner.search.progress import SearchProgress
    from tuner.search.run import run_search
    from tuner.search.worker_processes import run_processes
    from tuner.search.workers import WorkerSpec

    rec = replay_recording
    p = rec.problem
    run_search(SearchOptions(gpu=rec.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                             dtype=p.dtype, causal=p.causal, backend="replay", replay_from=rec.url,
                             db_url=sqlite_url, trials=1, seed=3))
    name = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    monkeypatch.setenv(DELAY_ENV, "0.2")  # the good worker alone would take 30 * 0.2 s
    jobs = (WorkerJob(0, name, 30),)
    good = WorkerSpec(0, 0, sqlite_url, sqlite_url, "replay", jobs, rec.url, local_workers=2)
    bad = WorkerSpec(1, 1, sqlite_url, sqlite_url, "replay", jobs, f"sqlite:///{tmp_path / 'missing.db'}",
                     local_workers=2)
    started = time.monotonic()
    with SearchProgress(Console(file=io.StringIO()), enabled=False) as progress:
        with pytest.raises(TunerError, match="no results store"):
            run_processes([good, bad], progress, lambda text: None)
    assert finished_trials(the_study(rec, sqlite_url)) < 1 + 30  # the good worker stopped early
    assert time.monotonic() - started < 60
    assert not [t for t in the_study(rec, sqlite_url).trials if t.state == optuna.trial.TrialState.RUNNING]


def test_ctrl_c_to_the_process_group_lets_every_worker_finish_its_trial(replay_recording, sqlite_url):
    rec = replay_recording
    env = {**os.environ, DELAY_ENV: "0.3", "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    args = search_args(rec, sqlite_url, 200, "--devices", "0,1", "--seed", "8", "--sampler", "random")
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if Path(sqlite_url[len("sqlite:///"):]).exists() and len({r.run_id for r in trials_of(sqlite_url)}) == 2:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: every process of the group gets it
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err.decode()
    assert "stopping after the current trial" in err.decode() and "search summary" in out.decode()
    study = the_study(rec, sqlite_url)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    # No trial in flight was aborted: the children ignore the terminal's SIGINT and finish the trial they
    # measure. (A point asked while the other worker measured the same one, still waiting when the stop
    # came, is told interrupted without being measured: that is not an abort.)
    stages = {t.number: t.user_attrs["interrupted"] for t in study.trials if t.user_attrs.get("interrupted")}
    assert "measuring" not in stages.values(), stages
    assert finished_trials(study) < 200


@given(workers=st.integers(1, 6), count=st.integers(1, 6))
def test_each_worker_goes_round_every_study_from_its_own_and_each_study_has_one_confirming_worker(workers, count):
    from types import SimpleNamespace

    from tuner.search.run import worker_jobs

    studies = [SimpleNamespace(study_name=f"s{i}") for i in range(count)]
    remaining = [10 * (i + 1) for i in range(count)]
    plans = [worker_jobs(w, workers, studies, remaining) for w in range(workers)]
    for w, jobs in enumerate(plans):
        assert sorted(j.index for j in jobs) == list(range(count)) and jobs[0].index == w % count
        assert all(j.study == f"s{j.index}" for j in jobs)
        # one card: its own budget per study; several: the study's shared budget decides
        assert [j.trials for j in jobs] == ([remaining[j.index] for j in jobs] if workers == 1 else [None] * count)
        assert all(j.deadline is None for j in jobs)  # a time budget is shared as each study starts (time_share)
    for i in range(count):
        assert sum(j.confirm for jobs in plans for j in jobs if j.index == i) == 1


def test_two_cards_share_the_confirm_stage_each_round_timed_on_one_card(replay_recording, sqlite_url):
    rec = replay_recording
    # Paced like a card (0.05 s a measurement), so both workers end the study together.
    result = run_tuner(*search_args(rec, sqlite_url, 30, "--devices", "0,1", "--seed", "5", "--confirm", "3",
                                    "--confirm-rounds", "6"), env={DELAY_ENV: "0.05", "COLUMNS": "250"})
    assert result.exit_code == 0, result.stderr
    attrs = the_study(rec, sqlite_url).user_attrs
    shares = [v for k, v in attrs.items() if k.startswith("confirm_share:")]
    assert len(shares) == 2 and all(s["rounds"] for s in shares)  # both cards timed rounds
    pooled = sum(len(s["rounds"]) for s in shares)
    assert pooled in (6, 7)  # two cards may both start the last round
    assert attrs["confirm_plan"]["done"]
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(rec.problem)
    assert confirmed is not None and confirmed.rounds == pooled
    assert f"median of {pooled} interleaved rounds on 2 cards" in result.stdout + result.stderr


def test_worker_processes_never_given_work_end_at_once(monkeypatch):
    from tuner.search.worker_processes import started_workers

    started = time.monotonic()
    with started_workers((0, 1), None) as processes:
        assert processes is not None and all(p.is_alive() for p in processes.procs)
    assert not any(p.is_alive() for p in processes.procs)
    assert all(p.exitcode == 0 for p in processes.procs)  # left on their own, not killed
    assert time.monotonic() - started < 30
    with started_workers((0,), None) as one:
        assert one is None  # one card runs in this process


def test_a_bad_search_with_several_devices_leaves_no_worker_process(replay_recording, sqlite_url):
    rec = replay_recording
    result = run_tuner(*search_args(rec, sqlite_url, 5, "--devices", "0,1", "--template", "no_such_template"))
    assert result.exit_code == 2 and "no_such_template" in result.stderr and "Traceback" not in result.stderr
