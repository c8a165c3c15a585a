"""Which running trials are alive, and the budget several processes on one study share.

A worker stamps each trial it asked with its host:pid and a heartbeat (a
user attribute refreshed every HEARTBEAT_S while the trial is in its hands).
A running trial is abandoned when it was told interrupted, when its process
on this host is gone, or when its heartbeat is older than STALE_S (a process
killed on another host, or by SIGKILL). Any worker reaps abandoned trials:
they are told FAIL, marked interrupted, and no longer count toward the
budget or make others wait for them.

The budget of a study is shared: a worker asks a trial only while the
finished trials that count plus the live running ones are below it, so
three processes on a 300-trial study run 300 trials, not 900.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Iterable, Optional

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.search.study import ATTR_INFEASIBLE, ATTR_INTERRUPTED, ATTR_REPEAT, counts_toward_budget

ATTR_WORKER = "worker"  # host:pid of the process that asked a trial
ATTR_HEARTBEAT = "heartbeat"  # unix time the asking process last vouched for the trial
HEARTBEAT_S = 15.0
STALE_S = 120.0  # eight missed heartbeats: the process is gone

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(worker: str) -> bool:
    """The process named host:pid is on this host and gone."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def abandoned(trial: FrozenTrial, now: Optional[float] = None) -> bool:
    """A running trial nobody will finish (see the module doc)."""
    if trial.user_attrs.get(ATTR_INTERRUPTED):
        return True
    worker = str(trial.user_attrs.get(ATTR_WORKER, ""))
    if worker == WORKER_ID:
        return False
    if _dead_here(worker):
        return True
    beat = trial.user_attrs.get(ATTR_HEARTBEAT)
    if beat is None and trial.datetime_start is not None:
        beat = trial.datetime_start.timestamp()
    return beat is not None and (time.time() if now is None else now) - float(beat) > STALE_S


def reap(study: optuna.Study, now: Optional[float] = None) -> list[int]:
    """Tell every abandoned running trial FAIL (marked interrupted); returns their numbers."""
    reaped = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not abandoned(trial, now):
            continue
        try:
            study._storage.set_trial_user_attr(trial._trial_id, ATTR_INTERRUPTED, "reaped: no sign of life")
            study.tell(trial.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):  # finished meanwhile (its process was alive after all)
            continue
        reaped.append(trial.number)
    return reaped


def _holds_a_slot(trial: FrozenTrial) -> bool:
    """Whether a trial spends or holds one of the budget's trials."""
    if trial.state == TrialState.WAITING:
        return False
    if trial.state != TrialState.RUNNING:
        return counts_toward_budget(trial)
    # No worker yet: being asked right now, or its process died mid-ask; neither holds a budgeted trial.
    attrs = trial.user_attrs
    return (ATTR_WORKER in attrs and not attrs.get(ATTR_INFEASIBLE) and not attrs.get(ATTR_REPEAT)
            and not abandoned(trial))


def budget_taken(study: optuna.Study) -> int:
    """Trials of the budget spent or in hand: finished ones that count, and live running ones."""
    return sum(_holds_a_slot(t) for t in study.get_trials(deepcopy=False))


def over_budget(study: optuna.Study, trial_number: int, budget: int) -> bool:
    """Whether a trial just asked (and stamped) lies beyond the budget: the budget goes to the lowest
    trial numbers, so of several processes that asked at once, the later ones give theirs back."""
    before = sum(_holds_a_slot(t) for t in study.get_trials(deepcopy=False)
                 if t.state != TrialState.RUNNING or t.number < trial_number)
    return before >= budget


class Heartbeat:
    """A daemon thread that refreshes the heartbeat of the trials `in_hand()` names, every HEARTBEAT_S."""

    def __init__(self, study: optuna.Study, in_hand: Callable[[], Iterable[int]],
                 interval_s: float = HEARTBEAT_S) -> None:
        self._study, self._in_hand, self._interval = study, in_hand, interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            try:  # the thread must outlive any one failure: without beats, others reap this worker's trials
                for trial_id in list(self._in_hand()):
                    self._study._storage.set_trial_user_attr(trial_id, ATTR_HEARTBEAT, time.time())
            except Exception:  # noqa: BLE001 - told meanwhile, or the store is busy: the next beat retries
                pass


def running_duplicate(study: optuna.Study, trial: optuna.trial.Trial, wanted: int, ignored: set[int]) -> Optional[int]:
    """Number of an earlier-asked running trial of the same point (another worker, or compiling ahead).

    A running trial whose parameters are not all `wanted` yet (its ask is in progress elsewhere) is
    waited for briefly, then put in `ignored` for good.
    """
    params = trial.params
    deadline = time.monotonic() + 2.0
    while True:
        incomplete = []
        for other in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if other.number >= trial.number or other.number in ignored or abandoned(other):
                continue
            if len(other.params) < wanted:
                incomplete.append(other.number)
            elif other.params == params:
                return other.number
        if not incomplete:
            return None
        if time.monotonic() > deadline:
            ignored.update(incomplete)
            return None
        time.sleep(0.01)


def trial_by_number(study: optuna.Study, number: Optional[int]) -> Optional[FrozenTrial]:
    for other in study.get_trials(deepcopy=False):
        if other.number == number:
            return other
    return None


def await_running(study: optuna.Study, timeout_s: float = 120.0, poll_s: float = 0.1) -> None:
    """Wait (at most `timeout_s`) until the study holds no live running trial: the other workers'
    last measurements are stored before the confirm stage picks the best."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not any(not abandoned(t) for t in running):
            return
        time.sleep(poll_s)
