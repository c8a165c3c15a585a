"""Who runs a trial, written by the very record that makes the trial RUNNING.

Optuna creates a trial RUNNING and the sampler picks its point afterwards, which takes a while
(TPE). Stamped after that, a trial whose process was killed meanwhile ran with no owner, and other
processes could only wait for it (2 s per start, up to 120 s before a confirm stage). The storages
of a search (study.storage_for) therefore create every trial with its owner in the creating record:
the host:pid, the pid space it belongs to (a container's pids are its own), this process's
session (a pid is reused: in a container the tuner is often pid 1 on every start) and a first
heartbeat, and which store it writes (a copy of a store holds its original's running trials, whose
owners are alive and writing elsewhere: tuner.search.liveness). A queued (warm-start) trial is taken by
one record and stamped by the next; only that moment, and trials written by older versions, have no owner.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import uuid
from typing import Any, Optional, Sequence

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

ATTR_WORKER = "worker"  # host:pid of the process that asked a trial
ATTR_PID_SPACE = "pid_space"  # the boot and pid namespace that pid belongs to
ATTR_SESSION = "worker_session"  # which life of that host:pid (a pid is reused)
ATTR_HEARTBEAT = "heartbeat"  # unix time the asking process last vouched for the trial
ATTR_STORE = "worker_store"  # the store that process writes, as it identifies it (store_identity)


def _pid_space() -> str:
    """This process's kernel boot and pid namespace (Linux): a pid means one process only within them.
    Empty where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


HOST = socket.gethostname()
WORKER_ID = f"{HOST}:{os.getpid()}"
PID_SPACE = _pid_space()
SESSION = uuid.uuid4().hex[:12]


def sqlite_identity(path: str) -> Optional[str]:
    """Which SQLite file this is, on this host: its device and inode. A copy is another file (a backup
    tool, cp), while a process that has the file open keeps writing it when it is renamed. None where it
    cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return f"sqlite:{stat.st_dev}:{stat.st_ino}"


def postgres_identity(engine: Any) -> Optional[str]:
    """Which PostgreSQL database this is: its cluster (system identifier, where this role may read it), the
    server's port and the database's oid; a dump restored elsewhere, or a copy made with CREATE DATABASE ...
    TEMPLATE, differs. None where it cannot be read."""
    from sqlalchemy import text

    try:
        with engine.connect() as conn:
            port, oid = conn.execute(text("SELECT current_setting('port'), oid FROM pg_database "
                                          "WHERE datname = current_database()")).one()
        try:
            with engine.connect() as conn:
                cluster = conn.scalar(text("SELECT system_identifier FROM pg_control_system()"))
        except Exception:  # noqa: BLE001 - not granted to this role: the port and oid still tell copies apart
            cluster = ""
    except Exception:  # noqa: BLE001 - no identity: owners are judged by host, pid and heartbeat alone
        return None
    return f"postgresql:{cluster}:{port}:{oid}"


def owner_attrs(store: Optional[str] = None) -> dict[str, Any]:
    """The user attributes that name this process as a trial's owner, writing `store` (its identity), with a
    fresh heartbeat."""
    attrs = {ATTR_WORKER: WORKER_ID, ATTR_PID_SPACE: PID_SPACE, ATTR_SESSION: SESSION, ATTR_HEARTBEAT: time.time()}
    if store is not None:
        attrs[ATTR_STORE] = store
    return attrs


def owned_trial(store: Optional[str] = None) -> FrozenTrial:
    """A template for a new RUNNING trial owned by this process (what Study.ask would create, plus the owner)."""
    return FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.datetime.now(),
                       datetime_complete=None, params={}, distributions={}, user_attrs=owner_attrs(store),
                       system_attrs={}, intermediate_values={}, trial_id=-1)


class OwnedTrials:
    """Storage mixin: trials this process creates carry their owner from their first record; a queued
    trial it takes is stamped right after. `store_identity` is the store the storage writes."""

    store_identity: Optional[str] = None

    def create_new_trial(self, study_id: int, template_trial: Optional[FrozenTrial] = None) -> int:
        return super().create_new_trial(study_id, template_trial or owned_trial(self.store_identity))  # type: ignore[misc]

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Optional[Sequence[float]] = None) -> bool:
        taken = super().set_trial_state_values(trial_id, state, values)  # type: ignore[misc]
        if taken and state == TrialState.RUNNING:  # a queued trial popped by Study.ask
            try:
                for key, value in owner_attrs(self.store_identity).items():
                    self.set_trial_user_attr(trial_id, key, value)  # type: ignore[attr-defined]
            except UpdateFinishedTrialError:  # reaped in the moment it had no owner: take another
                return False
        return taken


class OwnedRDBStorage(OwnedTrials, optuna.storages.RDBStorage):
    """Optuna's RDBStorage (PostgreSQL) creating owned trials; Optuna's cache calls _create_new_trial."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.store_identity = postgres_identity(self.engine)

    def _create_new_trial(self, study_id: int, template_trial: Optional[FrozenTrial] = None) -> FrozenTrial:
        return super()._create_new_trial(study_id, template_trial or owned_trial(self.store_identity))
