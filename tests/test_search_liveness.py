"""Trials left RUNNING by a process that died: reclaimed at once, never waited for, and the budget holds.

A trial names its owner from the record that creates it (tuner.search.ownership); a dead owner on
this host is seen at once, one elsewhere by its heartbeat (tuner.search.liveness).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import optuna
import pytest
from cli_helpers import run_tuner
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import FloatDistribution
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import FrozenTrial, TrialState

from tuner.search import ownership
from tuner.search.liveness import (
    ASK_GRACE_S,
    STALE_S,
    abandoned,
    await_running,
    budget_taken,
    reap,
    running_duplicate,
)
from tuner.search.ownership import ATTR_HEARTBEAT, ATTR_PID_SPACE, ATTR_SESSION, ATTR_WORKER, WORKER_ID
from tuner.search.study import (
    ATTR_INFEASIBLE,
    ATTR_INTERRUPTED,
    ATTR_OBJECTIVE,
    counts_toward_budget,
    finished_trials,
    load_study,
    opened_storage,
    storage_for,
)
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

ROOT = Path(__file__).resolve().parents[1]
X = {"x": FloatDistribution(0.0, 1.0)}


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


# A process killed while Optuna creates its trial: after the trial's record, before its point is chosen
# (the sampler runs after the creation; the loop used to stamp the owner after that).
KILLED_MID_ASK = """
    import os, signal, sys
    import optuna
    from tuner.search.study import storage_for

    class Killed(optuna.samplers.RandomSampler):
        def sample_independent(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

    study = optuna.load_study(study_name="s", storage=storage_for(sys.argv[1]), sampler=Killed())
    study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
"""


def test_a_trial_whose_process_was_killed_mid_ask_costs_no_wait(store_url):
    study = optuna.create_study(study_name="s", storage=storage_for(store_url))
    killed = _child(KILLED_MID_ASK, store_url)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [orphan] = study.get_trials(states=(TrialState.RUNNING,))
    assert orphan.params == {} and orphan.user_attrs[ATTR_WORKER] != WORKER_ID  # its owner was recorded
    assert abandoned(orphan)
    assert budget_taken(study) == 0

    mine, ignored = study.ask(X), set()
    started = time.monotonic()
    assert running_duplicate(study, mine, len(X), ignored) is None  # a start used to wait 2 s for its point
    assert time.monotonic() - started < 1.0 and ignored == set()
    study.tell(mine, 0.5)
    started = time.monotonic()
    await_running(study, timeout_s=30)  # the confirm stage's wait for the last trials: up to 120 s before
    assert time.monotonic() - started < 1.0

    assert reap(study) == [orphan.number]
    gone = study.get_trials()[orphan.number]
    assert gone.state == TrialState.FAIL and gone.user_attrs[ATTR_INTERRUPTED] and not counts_toward_budget(gone)


def test_every_trial_is_created_with_its_owner_in_the_creating_record(sqlite_url, tmp_path):
    """No moment when a trial runs unowned: the journal's create record carries the owner."""
    study = optuna.create_study(study_name="s", storage=storage_for(sqlite_url))
    trial = study.ask(X)
    with sqlite3.connect(tmp_path / "results.db") as conn:
        logs = [json.loads(row[0]) for row in conn.execute("SELECT log FROM optuna_journal ORDER BY id")]
    [created] = [log for log in logs if log["op_code"] == JournalOperation.CREATE_TRIAL]
    assert created["user_attrs"][ATTR_WORKER] == WORKER_ID
    assert created["user_attrs"][ATTR_SESSION] == ownership.SESSION
    assert created["user_attrs"][ATTR_PID_SPACE] == ownership.PID_SPACE and ATTR_HEARTBEAT in created["user_attrs"]
    assert trial.user_attrs[ATTR_WORKER] == WORKER_ID and not abandoned(study.get_trials()[0])


def test_a_queued_trial_is_owned_by_the_process_that_takes_it(store_url):
    study = optuna.create_study(study_name="s", storage=storage_for(store_url))
    study.enqueue_trial({"x": 0.25})
    trial = study.ask(X)
    assert trial.params == {"x": 0.25}
    frozen = study.get_trials()[0]
    assert frozen.user_attrs[ATTR_WORKER] == WORKER_ID and frozen.user_attrs[ATTR_SESSION] == ownership.SESSION
    assert not abandoned(frozen) and budget_taken(study) == 1


def _running(study: optuna.Study, started_ago_s: float = 0.0, **attrs) -> FrozenTrial:
    """A running trial with exactly these user attributes (as another process or an older tuner wrote it)."""
    started = datetime.datetime.now() - datetime.timedelta(seconds=started_ago_s)
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=started,
                           datetime_complete=None, params={}, distributions={}, user_attrs=attrs, system_attrs={},
                           intermediate_values={}, trial_id=-1)
    trial_id = study._storage.create_new_trial(study._study_id, template)
    return study._storage.get_trial(trial_id)


def test_a_dead_processes_stored_result_is_told_not_thrown_away(sqlite_url):
    """Killed between storing a trial and telling it: the reaper tells the stored result (it counts);
    a stored pruned point stays free; a trial with nothing stored is interrupted (free)."""
    from store_factories import H100, trial

    study = optuna.create_study(study_name="s", storage=storage_for(sqlite_url))
    elsewhere = dict(worker="elsewhere:1", heartbeat=time.time() - STALE_S - 1)
    measured, pruned, failed, nothing = (_running(study, **elsewhere) for _ in range(4))
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        rows = {t.number: store.add_trial(trial(run, study="s", trial_number=t.number, status=s, median_us=m,
                                                params={"BLOCK_M": t.number}, error=e))
                for t, s, m, e in ((measured, TrialStatus.OK, 42.0, None),
                                   (pruned, TrialStatus.PRUNED, None, "smem over the limit"),
                                   (failed, TrialStatus.COMPILE_ERROR, None, "nvcc failed"))}
        assert sorted(reap(study, store)) == [measured.number, pruned.number, failed.number, nothing.number]
    after = study.get_trials()
    assert after[measured.number].state == TrialState.COMPLETE and after[measured.number].value == 42.0
    assert after[measured.number].user_attrs["store_trial_id"] == rows[measured.number]
    assert after[pruned.number].state == TrialState.PRUNED and after[pruned.number].user_attrs[ATTR_INFEASIBLE]
    assert after[failed.number].state == TrialState.FAIL and after[failed.number].user_attrs["status"] == "compile_error"
    assert after[nothing.number].state == TrialState.FAIL and after[nothing.number].user_attrs[ATTR_INTERRUPTED]
    assert [counts_toward_budget(after[t.number]) for t in (measured, pruned, failed, nothing)] == \
        [True, False, True, False]
    assert finished_trials(study) == budget_taken(study) == 2


@pytest.mark.parametrize("objective, told", [("time", 42.0), ("isolated", 38.5), ("energy", None)])
def test_a_reaped_trial_is_told_the_figure_its_study_minimizes(sqlite_url, objective: str, told) -> None:
    """A study minimizing isolated µs or J per call is told that figure of a dead process's stored trial, never
    the back-to-back µs (a trial told µs among joules, or among isolated µs, mixes objectives); a row
    without the figure (no energy reading) is FAIL."""
    from store_factories import H100, trial

    study = optuna.create_study(study_name="s", storage=storage_for(sqlite_url))
    study.set_user_attr(ATTR_OBJECTIVE, objective)
    dead = _running(study, worker="elsewhere:1", heartbeat=time.time() - STALE_S - 1)
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        store.add_trial(trial(run, study="s", trial_number=dead.number, median_us=42.0, isolated_us=38.5))
        assert reap(study, store) == [dead.number]
    after = study.get_trials()[dead.number]
    assert (after.state, after.value) == ((TrialState.COMPLETE, told) if told else (TrialState.FAIL, None))


def _dead_pid() -> int:
    """The pid of a process of this host that has ended."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(gone.stdout)


# Owners a running trial may have, and whether it is abandoned: at once where the process is known to be
# gone, by heartbeat elsewhere, after ASK_GRACE_S without an owner.
HERE = {"pid_space": ownership.PID_SPACE}
OWNERS = {
    "this process": (False, lambda: dict(worker=WORKER_ID, worker_session=ownership.SESSION, **HERE)),
    "parent, alive here": (False, lambda: dict(worker=f"{ownership.HOST}:{os.getppid()}", **HERE)),
    "dead here": (True, lambda: dict(worker=f"{ownership.HOST}:{_dead_pid()}", **HERE)),
    "this pid, an earlier life": (True, lambda: dict(worker=WORKER_ID, worker_session="before", **HERE)),
    "same name, another pid space": (False, lambda: dict(worker=WORKER_ID, pid_space="boot/pid:[7]")),
    "another host": (False, lambda: dict(worker="elsewhere:7")),
    "another host, silent": (True, lambda: dict(worker="elsewhere:7", heartbeat=time.time() - STALE_S - 1)),
    "none, just taken": (False, lambda: {}),
    "none, for a while": (True, lambda: {}),
}
STORED = {"ok": TrialStatus.OK, "pruned": TrialStatus.PRUNED, "compile_error": TrialStatus.COMPILE_ERROR}


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('liveness') / 'results.db'}"


@settings(max_examples=30, deadline=None)
@given(population=st.lists(st.tuples(st.sampled_from(sorted(OWNERS)), st.sampled_from([None, *sorted(STORED)])),
                           min_size=1, max_size=8))
def test_reaping_finishes_exactly_the_abandoned_trials_and_orphans_no_stored_result(shared_store, population):
    """Whatever mix of owners and stored results: reaping finishes the abandoned trials and only them, each
    as its stored row says (or interrupted and free when it has none), and afterwards every stored result
    belongs to a trial that counts, a free pruned point, or a live running trial."""
    from store_factories import H100, trial

    study = optuna.create_study(study_name=f"s{uuid.uuid4().hex}", storage=storage_for(shared_store))
    expected: dict[int, tuple[bool, str | None]] = {}
    with open_store(shared_store) as store:
        run = store.start_run(H100)
        for i, (owner, stored) in enumerate(population):
            gone, owned_by = OWNERS[owner]
            attrs = {} if owner.startswith("none") else {"heartbeat": time.time(), "worker_session": "x", **owned_by()}
            t = _running(study, started_ago_s=10 * ASK_GRACE_S if owner == "none, for a while" else 0, **attrs)
            if stored is not None:
                store.add_trial(trial(run, study=study.study_name, trial_number=t.number, status=STORED[stored],
                                      median_us=10.0 + i if stored == "ok" else None, params={"BLOCK_M": i}))
            expected[t.number] = (gone, stored)
        reaped = reap(study, store)
        rows = store.query_trials(TrialFilter(study=study.study_name))
    after = {t.number: t for t in study.get_trials()}
    assert sorted(reaped) == sorted(n for n, (gone, _) in expected.items() if gone)
    for number, (gone, stored) in expected.items():
        t = after[number]
        if not gone:
            assert t.state == TrialState.RUNNING
        elif stored == "ok":
            assert t.state == TrialState.COMPLETE and counts_toward_budget(t)
        elif stored == "pruned":
            assert t.state == TrialState.PRUNED and not counts_toward_budget(t)
        elif stored == "compile_error":
            assert t.state == TrialState.FAIL and counts_toward_budget(t)
        else:
            assert t.state == TrialState.FAIL and t.user_attrs[ATTR_INTERRUPTED] and not counts_toward_budget(t)
    for r in rows:
        t = after[r.trial_number]
        assert t.state == TrialState.RUNNING or counts_toward_budget(t) or t.user_attrs.get(ATTR_INFEASIBLE)
    owned_live = sum(1 for owner, _ in population if not OWNERS[owner][0] and not owner.startswith("none"))
    assert budget_taken(study) == finished_trials(study) + owned_live  # an unowned trial holds no budget


# --- the budget of a study holds for a store copied mid-write ------------------------------------

# `tuner search`, killed right after it stored its KILL_AT-th measured trial and before telling Optuna:
# the state a copy of the store taken at that moment holds as well.
KILLED_BETWEEN_STORE_AND_TELL = """
    import os, signal, sys
    from optuna.trial import TrialState
    from tuner.search import loop

    told, measured = loop.ProblemSearch._tell, []

    def tell(self, trial, state, *args, **kwargs):
        if state == TrialState.COMPLETE and args[1] == "measured":
            measured.append(trial.number)
            if len(measured) == int(os.environ["KILL_AT"]):
                os.kill(os.getpid(), signal.SIGKILL)
        return told(self, trial, state, *args, **kwargs)

    loop.ProblemSearch._tell = tell
    from tuner.cli.app import main
    sys.argv = ["tuner", *sys.argv[1:]]
    main()
"""


def _search_args(rec, db_url: str, trials: int, *extra: str) -> list[str]:
    p = rec.problem
    args = ["--db", db_url, "search", "--gpu", rec.profile, "--shape",
            f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}", "--dtype", p.dtype, "--backend", "replay",
            "--from", rec.url, "--trials", str(trials), "--seed", "3", "--study", "s", *extra]
    return args + (["--causal"] if p.causal else [])


def _snapshot(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite store (its WAL included), as a backup tool takes it."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def test_a_store_copied_between_storing_and_telling_a_trial_keeps_its_budget(replay_recording, store_url, tmp_path):
    budget = 12
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": "5"}
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_BETWEEN_STORE_AND_TELL),
                             *_search_args(replay_recording, store_url, budget)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    url = store_url
    if store_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'copy.db'}"
        _snapshot(Path(store_url[len("sqlite:///"):]), tmp_path / "copy.db")
    with open_store(url) as store, opened_storage(url) as storage:
        running = load_study(storage, "s").get_trials(states=(TrialState.RUNNING,))  # the one killed, those asked ahead
        [(number, row)] = [(t.number, found) for t in running
                           if (found := store.query_trials(TrialFilter(study="s", trial_number=t.number)))]
        assert len(row) == 1 and row[0].status is TrialStatus.OK  # stored, not told

    resumed = run_tuner(*_search_args(replay_recording, url, budget, "--resume"))
    assert resumed.exit_code == 0, resumed.stderr

    with open_store(url) as store:
        rows = store.query_trials(TrialFilter(study="s"))
    with opened_storage(url) as storage:
        study = load_study(storage, "s")
        trials = {t.number: t for t in study.get_trials()}
        assert finished_trials(study) == budget
    assert trials[number].state == TrialState.COMPLETE and trials[number].value == row[0].median_us
    # Every stored result belongs to a trial the study counts (or a free pruned point): none is orphaned
    # by an interrupted trial, so the ok results never outnumber the budget.
    for r in rows:
        t = trials[r.trial_number]
        assert counts_toward_budget(t) or (t.state == TrialState.PRUNED and t.user_attrs.get(ATTR_INFEASIBLE)), r
    assert sum(r.status is TrialStatus.OK for r in rows) <= budget


class NeighbourDiesMidSearch:
    """The replay backend; at its third measurement another process on the study "dies" having stored a
    trial it had not told yet (its pid is gone)."""

    needs_compile = False

    def __init__(self, recording, db_url: str) -> None:
        from tuner.backends.replay import ReplayBackend
        from tuner.profiles import load_profile

        self.inner, self.url, self.calls = ReplayBackend(recording.url, load_profile(recording.profile)), db_url, 0
        self.left_behind: tuple[int, float] | None = None  # its trial number and stored median

    def measure(self, problem, variant, compiled, *, range_prefix=""):
        self.calls += 1
        if self.calls == 3:
            self._die_holding_a_stored_trial()
        return self.inner.measure(problem, variant, compiled)

    def _die_holding_a_stored_trial(self) -> None:
        from store_factories import H100, trial

        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        owner = dict(worker=f"{ownership.HOST}:{int(gone.stdout)}", pid_space=ownership.PID_SPACE,
                     worker_session="theirs", heartbeat=time.time())
        with opened_storage(self.url) as storage, open_store(self.url) as store:
            study = load_study(storage, "s")
            left = _running(study, **owner)
            store.add_trial(trial(store.start_run(H100), study="s", trial_number=left.number, median_us=55.5,
                                  params={"BLOCK_M": 999}))
        self.left_behind = (left.number, 55.5)

    def __getattr__(self, name: str):  # device_facts, baselines, confirm, close: the replay backend's
        if name == "submit_measure":  # measured through measure() above
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_trial_stored_by_a_process_that_died_mid_search_is_counted_before_the_budget_runs_out(
        replay_recording, sqlite_url):
    """Settled when the survivors next ask, not at the next start: otherwise it would be told its result
    after the budget was spent elsewhere, one trial too many."""
    from tuner.search.hooks import Hooks

    budget = 10
    backend = NeighbourDiesMidSearch(replay_recording, sqlite_url)
    result = run_tuner(*_search_args(replay_recording, sqlite_url, budget),
                       hooks=Hooks(make_backend=lambda *_a, **_k: backend))
    assert result.exit_code == 0, result.stderr
    assert backend.left_behind is not None
    number, median = backend.left_behind
    with opened_storage(sqlite_url) as storage, open_store(sqlite_url) as store:
        study = load_study(storage, "s")
        trials = {t.number: t for t in study.get_trials()}
        rows = store.query_trials(TrialFilter(study="s"))
        assert finished_trials(study) == budget
    assert trials[number].state == TrialState.COMPLETE and trials[number].value == median
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING]
    for r in rows:
        t = trials[r.trial_number]
        assert counts_toward_budget(t) or (t.state == TrialState.PRUNED and t.user_attrs.get(ATTR_INFEASIBLE)), r


# --- a copy of a store resumed while its original runs ---------------------------------------------


def test_a_copy_resumed_while_its_original_runs_does_not_wait_for_the_originals_trials(replay_recording, tmp_path):
    """The copy's running trials belong to a process alive on this host, writing the original: they are
    recognised by the store their owner writes (its identity), not waited for (a resume stalled about 110 s
    on them) and not left RUNNING; the copy resumes to its budget."""
    original, copy = tmp_path / "results.db", tmp_path / "copy.db"
    url = f"sqlite:///{original}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_REPLAY_DELAY_S": "0.5"}
    running = subprocess.Popen([sys.executable, "-m", "tuner", *_search_args(replay_recording, url, 500)], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # a copy taken while the original holds a running trial (it measures for 0.5 s each)
            assert running.poll() is None and time.monotonic() < deadline, running.stderr.read()[-2000:]
            if original.exists():
                _snapshot(original, copy)
                with opened_storage(f"sqlite:///{copy}") as storage:
                    study = load_study(storage, "s") if storage.get_all_studies() else None
                    if study is not None and study.get_trials(states=(TrialState.RUNNING,)):
                        budget = finished_trials(study) + 3
                        break
            time.sleep(0.1)
        started = time.monotonic()
        resumed = subprocess.run([sys.executable, "-m", "tuner",
                                  *_search_args(replay_recording, f"sqlite:///{copy}", budget, "--resume")],
                                 cwd=ROOT, env={**env, "TUNER_REPLAY_DELAY_S": "0"}, capture_output=True, text=True,
                                 timeout=90)
        elapsed = time.monotonic() - started
        assert running.poll() is None  # the original ran all along
    finally:
        running.kill()
        running.communicate()
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert elapsed < 45, f"the resume of the copy took {elapsed:.0f} s"
    with opened_storage(f"sqlite:///{copy}") as storage:
        study = load_study(storage, "s")
        assert not study.get_trials(states=(TrialState.RUNNING,))
        assert finished_trials(study) == budget


def test_a_store_is_told_apart_from_its_copy_by_its_identity(store_url, tmp_path):
    """Two storages of one store share its identity; a copy (another SQLite file, another PostgreSQL database)
    has its own. A trial a live owner on this host wrote into another store is abandoned, here at once."""
    from sqlalchemy.engine import make_url

    from tuner.search.liveness import store_identity

    with opened_storage(store_url) as one, opened_storage(store_url) as two:
        assert one.store_identity is not None and one.store_identity == two.store_identity
        study = optuna.create_study(study_name="s", storage=one)
        ours = study.ask(X)
        assert study.get_trials()[ours.number].user_attrs[ownership.ATTR_STORE] == one.store_identity
        assert store_identity(study) == one.store_identity and not abandoned(study.get_trials()[0],
                                                                           here=one.store_identity)
        alive_here = dict(worker=f"{ownership.HOST}:{os.getppid()}", pid_space=ownership.PID_SPACE,
                          worker_session="theirs", heartbeat=time.time())
        other_store = _running(study, **alive_here, worker_store="sqlite:0:0")
        this_store = _running(study, **alive_here, worker_store=one.store_identity)
        mine_elsewhere = _running(study, **ownership.owner_attrs("sqlite:0:0"))
        assert reap(study) == [other_store.number, mine_elsewhere.number]
        assert study.get_trials()[this_store.number].state == TrialState.RUNNING
    if store_url.startswith("sqlite"):
        _snapshot(Path(make_url(store_url).database), tmp_path / "copy.db")
        other_url = f"sqlite:///{tmp_path / 'copy.db'}"
    else:  # another database of the same server
        from conftest import _fresh_pg_database

        databases = _fresh_pg_database()
        other_url = next(databases)
    try:
        with opened_storage(other_url) as other, opened_storage(store_url) as one:
            assert other.store_identity is not None and other.store_identity != one.store_identity
    finally:
        if not store_url.startswith("sqlite"):
            databases.close()
