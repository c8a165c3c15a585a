"""Trials left RUNNING by a process that died: reclaimed at once, never waited for.

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
from pathlib import Path

import optuna
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
    ATTR_INTERRUPTED,
    counts_toward_budget,
    storage_for,
)

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
    assert trial.user_attrs[ATTR_WORKER] == WORKER_ID and not abandoned(study.get_trials()[0])


def test_a_queued_trial_is_owned_by_the_process_that_takes_it(store_url):
    study = optuna.create_study(study_name="s", storage=storage_for(store_url))
    study.enqueue_trial({"x": 0.25})
    trial = study.ask(X)
    assert trial.params == {"x": 0.25}
    frozen = study.get_trials()[0]
    assert frozen.user_attrs[ATTR_WORKER] == WORKER_ID and frozen.user_attrs[ATTR_SESSION] == ownership.SESSION
    assert not abandoned(frozen) and budget_taken(study) == 1


def _running(study: optuna.Study, **attrs) -> FrozenTrial:
    """A running trial with exactly these user attributes (as another process or an older tuner wrote it)."""
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.datetime.now(),
                           datetime_complete=None, params={}, distributions={}, user_attrs=attrs, system_attrs={},
                           intermediate_values={}, trial_id=-1)
    trial_id = study._storage.create_new_trial(study._study_id, template)
    return study._storage.get_trial(trial_id)


def test_who_is_gone_at_once_and_who_only_by_heartbeat(sqlite_url):
    study = optuna.create_study(study_name="s", storage=storage_for(sqlite_url))
    now, fresh, stale = time.time(), time.time(), time.time() - STALE_S - 1
    here = dict(pid_space=ownership.PID_SPACE)
    # This host:pid in an earlier life (a restarted container's tuner is pid 1 again): gone.
    earlier = _running(study, worker=WORKER_ID, worker_session="before", heartbeat=fresh, **here)
    assert abandoned(earlier, now)
    # The same host name and pid in another pid space (another container): judged by its heartbeat only.
    other_space = dict(worker=WORKER_ID, worker_session="other", pid_space="another-boot/pid:[1]")
    assert not abandoned(_running(study, heartbeat=fresh, **other_space), now)
    assert abandoned(_running(study, heartbeat=stale, **other_space), now)
    # A pid of this host that no process has: gone, however fresh its heartbeat.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    worker = f"{ownership.HOST}:{int(dead.stdout)}"
    assert abandoned(_running(study, worker=worker, worker_session="x", heartbeat=fresh, **here), now)
    # Alive here (this test's parent process): not abandoned while it beats.
    parent = f"{ownership.HOST}:{os.getppid()}"
    assert not abandoned(_running(study, worker=parent, worker_session="x", heartbeat=fresh, **here), now)
    # Another host: only the heartbeat tells.
    assert not abandoned(_running(study, worker="elsewhere:1", heartbeat=fresh), now)
    assert abandoned(_running(study, worker="elsewhere:1", heartbeat=stale), now)
    # No owner (an older tuner, or a queued trial in the instant it is taken): only briefly waited for.
    unowned = _running(study)
    assert not abandoned(unowned, unowned.datetime_start.timestamp() + ASK_GRACE_S / 2)
    assert abandoned(unowned, unowned.datetime_start.timestamp() + ASK_GRACE_S + 0.1)
    # This process now: never.
    number = study.ask(X).number
    asked = study.get_trials()[number]
    assert ATTR_HEARTBEAT in asked.user_attrs and ATTR_PID_SPACE in asked.user_attrs
    assert not abandoned(asked, now + 10 * STALE_S)
