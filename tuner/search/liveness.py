"""Which running trials are alive, and the budget several processes on one study share.

Every trial names its owner from the record that creates it (tuner.search.ownership): host:pid,
pid space, session, and a heartbeat the owner refreshes every HEARTBEAT_S while the trial is in its
hands. A running trial is abandoned when it was told interrupted; at once when its owner's process
is known to be gone (its pid is this host's and no process has it, or this very process has it in
another life) or known to write another store (its process is alive here but the trial is in a copy of
the store it writes: the copy's running trials are nobody's); when its heartbeat is older than STALE_S (a process on another host, or in another
container, can only be judged so); or when it has no owner after ASK_GRACE_S (a queued trial is
stamped the moment after it is taken; older versions stamped trials late). Abandoned trials neither
hold budget nor make others wait, and any worker reaps them: a trial whose process stored its
result before it could tell it (a kill, or a store copied in that moment) is told that result and
counts like any other; the rest are told FAIL, marked interrupted, and are free.

The budget of a study is shared: a worker asks a trial only while the
finished trials that count plus the live running ones are below it, so
three processes on a 300-trial study run 300 trials, not 900.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.runtime.objective import TIME, figure
from tuner.search.ownership import (
    ATTR_HEARTBEAT,
    ATTR_PID_SPACE,
    ATTR_SESSION,
    ATTR_STORE,
    ATTR_WORKER,
    HOST,
    PID_SPACE,
    SESSION,
    WORKER_ID,
)
from tuner.search.study import (
    ATTR_INFEASIBLE,
    ATTR_INTERRUPTED,
    ATTR_OBJECTIVE,
    ATTR_REASON,
    ATTR_REPEAT,
    ATTR_SOURCE,
    ATTR_STATUS,
    ATTR_STORE_ID,
    counts_toward_budget,
)
from tuner.status import TrialStatus
from tuner.store import Store, TrialFilter, TrialRow

HEARTBEAT_S = 15.0
STALE_S = 120.0  # eight missed heartbeats: the process is gone
ASK_GRACE_S = 2.0  # an unowned running trial younger than this may be a queued trial being taken


def store_identity(study: optuna.Study) -> Optional[str]:
    """The identity of the store a study is read from (tuner.search.ownership.store_identity), where known."""
    storage = study._storage
    return getattr(storage, "store_identity", None) or getattr(getattr(storage, "_backend", None), "store_identity", None)


def _elsewhere(attrs: Mapping[str, Any], here: Optional[str]) -> bool:
    """The owner wrote the trial into another store than `here`, the one it is read from (both known)."""
    theirs = attrs.get(ATTR_STORE)
    return here is not None and theirs is not None and theirs != here


def mine(trial: FrozenTrial, here: Optional[str] = None) -> bool:
    """Whether this process (in this life) owns the trial, in the store `here` it is read from."""
    attrs = trial.user_attrs
    return attrs.get(ATTR_WORKER) == WORKER_ID and attrs.get(ATTR_SESSION) == SESSION and not _elsewhere(attrs, here)


def _gone(attrs: Mapping[str, Any], here: Optional[str] = None) -> bool:
    """The owner's process is known to be gone, for the store `here`: its pid means something here (this
    host, the same pid space where both know theirs) and no process has it, or this process has it in
    another life, or the process is alive but writes another store (this one is a copy)."""
    host, _, pid = str(attrs.get(ATTR_WORKER, "")).rpartition(":")
    space = attrs.get(ATTR_PID_SPACE)
    if host != HOST or not pid.isdigit() or (space and PID_SPACE and space != PID_SPACE):
        return False
    if _elsewhere(attrs, here):  # compared on this host only: a file's device and inode mean nothing elsewhere
        return True
    if int(pid) == os.getpid():
        return attrs.get(ATTR_SESSION) != SESSION
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def abandoned(trial: FrozenTrial, now: Optional[float] = None, here: Optional[str] = None) -> bool:
    """A running trial nobody will finish, read from the store `here` (store_identity; see the module doc)."""
    attrs = trial.user_attrs
    if attrs.get(ATTR_INTERRUPTED):
        return True
    now = time.time() if now is None else now
    started = trial.datetime_start.timestamp() if trial.datetime_start is not None else None
    if ATTR_WORKER not in attrs:
        return started is None or now - started > ASK_GRACE_S
    if mine(trial, here):
        return False
    if _gone(attrs, here):
        return True
    beat = attrs.get(ATTR_HEARTBEAT, started)
    return beat is not None and now - float(beat) > STALE_S


def reap(study: optuna.Study, store: Optional[Store] = None, now: Optional[float] = None) -> list[int]:
    """Finish every abandoned running trial (see the module doc; `store` holds the results its process
    may have stored); returns their numbers."""
    reaped, here = [], store_identity(study)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not abandoned(trial, now, here):
            continue
        row = None
        if store is not None:
            found = store.query_trials(TrialFilter(study=study.study_name, trial_number=trial.number, limit=1))
            row = found[0] if found else None
        try:
            if row is not None:
                tell_stored(study, trial, row, study.user_attrs.get(ATTR_OBJECTIVE, TIME))
            else:
                study._storage.set_trial_user_attr(trial._trial_id, ATTR_INTERRUPTED, "reaped: no sign of life")
                study.tell(trial.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):  # finished meanwhile (its process was alive after all)
            continue
        reaped.append(trial.number)
    return reaped


def tell_stored(study: optuna.Study, trial: FrozenTrial, row: TrialRow, objective: str) -> None:
    """Tell a trial what its own store row says, as its process would have: ok -> the study's objective's figure
    of it (µs back to back, J per call or isolated µs; FAIL where the row lacks it); pruned -> pruned and free
    (infeasible, or the backend could not measure it); any other status -> FAIL."""
    attrs: dict[str, Any] = {ATTR_STATUS: row.status.value, ATTR_SOURCE: "measured", ATTR_STORE_ID: row.id}
    if row.status is TrialStatus.PRUNED:
        attrs.update({ATTR_SOURCE: "pruned", ATTR_INFEASIBLE: True, ATTR_REASON: row.error or "pruned"})
    for key, value in attrs.items():
        study._storage.set_trial_user_attr(trial._trial_id, key, value)
    value = figure(objective, row) if row.status is TrialStatus.OK else None
    if value is not None and math.isfinite(value):
        study.tell(trial.number, value)
    else:
        study.tell(trial.number, state=TrialState.PRUNED if row.status is TrialStatus.PRUNED else TrialState.FAIL)


def _holds_a_slot(trial: FrozenTrial, here: Optional[str] = None) -> bool:
    """Whether a trial spends or holds one of the budget's trials."""
    if trial.state == TrialState.WAITING:
        return False
    if trial.state != TrialState.RUNNING:
        return counts_toward_budget(trial)
    # No owner yet: a queued trial in the instant it is taken, or one an older tuner left; neither holds budget.
    attrs = trial.user_attrs
    return (ATTR_WORKER in attrs and not attrs.get(ATTR_INFEASIBLE) and not attrs.get(ATTR_REPEAT)
            and not abandoned(trial, here=here))


def budget_taken(study: optuna.Study) -> int:
    """Trials of the budget spent or in hand: finished ones that count, and live running ones."""
    here = store_identity(study)
    return sum(_holds_a_slot(t, here) for t in study.get_trials(deepcopy=False))


def over_budget(study: optuna.Study, trial_number: int, budget: int) -> bool:
    """Whether a trial just asked (and stamped) lies beyond the budget: the budget goes to the lowest
    trial numbers, so of several processes that asked at once, the later ones give theirs back."""
    here = store_identity(study)
    before = sum(_holds_a_slot(t, here) for t in study.get_trials(deepcopy=False)
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
    params, here = trial.params, store_identity(study)
    deadline = time.monotonic() + 2.0
    while True:
        incomplete = []
        for other in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if other.number >= trial.number or other.number in ignored or abandoned(other, here=here):
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
    deadline, here = time.monotonic() + timeout_s, store_identity(study)
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not any(not abandoned(t, here=here) for t in running):
            return
        time.sleep(poll_s)
