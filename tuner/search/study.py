"""Where Optuna keeps its studies, and the study-level bookkeeping of a search.

Storage follows the results store:
- SQLite results (sqlite:///path/results.db): a JournalStorage whose journal is
  a table of the store itself (tuner.search.journal), so a store is one file to
  back up or copy, and each append is one transaction. Several worker processes
  on one host share it (plain SQLite cannot take Optuna's RDBStorage writers
  reliably).
- PostgreSQL results: Optuna's RDBStorage on the same database, in its own
  schema ("optuna"), so its tables (trials, alembic_version, ...) never meet
  the results store's.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.search.journal import LEGACY_SUFFIX, StoreJournalStorage, import_legacy_journal
from tuner.search.ownership import OwnedRDBStorage
from tuner.store import open_store
from tuner.store.engine import parse_url, scrub, sqlite_file
from tuner.store.optuna_tables import open_optuna_rdb
from tuner.store.redact import redact_url

# Study user attributes written by `tuner search` when it creates a study;
# `tuner worker` recovers what to tune from them.
ATTR_PROBLEM = "problem"
ATTR_TEMPLATE = "template"
ATTR_PROFILE = "gpu_profile"
ATTR_SAMPLER = "sampler"
ATTR_SEED = "seed"
ATTR_BUDGET = "trials_budget"
ATTR_EARLY_STOP = "early_stop"  # patience of the early stop (tuner.search.early_stop); absent: off
ATTR_OBJECTIVE = "objective"  # what the study minimizes (tuner.runtime.objective); absent: time

# Trial user attributes.
ATTR_VARIANT = "variant"
ATTR_STATUS = "status"
ATTR_SOURCE = "source"  # measured | store (served from the results store) | pruned
ATTR_STORE_ID = "store_trial_id"
ATTR_REASON = "reason"
ATTR_INTERRUPTED = "interrupted"  # told FAIL because the search stopped: the stage it was at
ATTR_INFEASIBLE = "infeasible"  # pruned before compiling (feasibility rules): free, so not a budgeted trial
ATTR_REPEAT = "repeat"  # a point the study already held, told from the store: free, so not a budgeted trial

optuna.logging.set_verbosity(logging.WARNING)


def storage_for(url: str, *, create: bool = True) -> optuna.storages.BaseStorage:
    """Optuna storage for a results-store URL (SQLite or PostgreSQL; a bare path to an old journal
    file next to a SQLite store stands for that store). With create=False a store that is not
    there is an error, and nothing is created."""
    text = results_url_for(url)
    parsed = parse_url(text)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = sqlite_file(parsed)
        if database is None:
            raise TunerError("a search needs a results store in a file or on PostgreSQL, not an in-memory SQLite database")
        store = open_store(text, create=create)  # creates its folder and schema on first use
        import_legacy_journal(store, database)
        return StoreJournalStorage(store, os.path.expanduser(database))
    if backend == "postgresql":
        return _postgres(parsed)
    raise TunerError(f"no Optuna storage for {backend} databases; use SQLite or PostgreSQL")


@contextmanager
def opened_storage(url: str, *, create: bool = True) -> Iterator[optuna.storages.BaseStorage]:
    """storage_for(url), closed (its connections released) on the way out."""
    storage = storage_for(url, create=create)
    try:
        yield storage
    finally:
        close = getattr(storage, "close", None)
        if close is not None:
            close()


def results_url_for(storage_url: str) -> str:
    """The results store that goes with an Optuna storage: the SQLite or PostgreSQL URL itself,
    or for a bare path to an old journal file, the SQLite file it sits next to."""
    text = storage_url.strip()
    if text.endswith(LEGACY_SUFFIX) and "://" not in text:
        return f"sqlite:///{text[:-len(LEGACY_SUFFIX)]}"
    return text


def _postgres(parsed: Any) -> optuna.storages.BaseStorage:
    url = parsed.render_as_string(hide_password=False)
    where = redact_url(url)
    try:  # under the schema lock: processes opening a fresh database at once collided creating Optuna's tables
        return open_optuna_rdb(url, OwnedRDBStorage)
    except TunerError:
        raise
    except Exception as exc:  # connection refused, bad password, no permission
        raise TunerError(f"cannot open the Optuna storage at {where}: {scrub(str(getattr(exc, 'orig', exc)), parsed)}") from None


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
        return True
    except KeyError:
        return False


def load_study(storage: optuna.storages.BaseStorage, name: str, sampler: Optional[optuna.samplers.BaseSampler] = None) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        raise TunerError(f"no study named {name!r} in the Optuna storage") from None


@dataclass(frozen=True)
class StudyInfo:
    """What a study tunes, from its user attributes."""

    name: str
    problem: Problem
    template: str
    profile: str
    sampler: str
    seed: Optional[int]
    budget: Optional[int]
    objective: str = "time"
    early_stop: Optional[int] = None  # stop after this many budgeted trials without a gain beyond the noise


def unfinished(study: optuna.Study) -> bool:
    """Whether the study's creation stopped before its attributes were all written (killed there, or its
    creator is still at it): `tuner search` writes the budget last and asks no trial before it. The next
    start completes such a study (tuner.search.prepare) instead of refusing it for good."""
    return ATTR_BUDGET not in study.user_attrs and not study.get_trials(deepcopy=False)


def study_info(study: optuna.Study) -> StudyInfo:
    attrs = study.user_attrs
    missing = [key for key in (ATTR_PROBLEM, ATTR_TEMPLATE, ATTR_PROFILE) if key not in attrs]
    if missing and unfinished(study):
        raise TunerError(f"study {study.study_name!r} is still being created, or its creation was interrupted: "
                         f"the `tuner search` that started it completes it")
    if missing:
        raise TunerError(f"study {study.study_name!r} was not created by `tuner search` (no {', '.join(missing)} attribute)")
    return StudyInfo(
        name=study.study_name,
        problem=Problem.from_dict(attrs[ATTR_PROBLEM]),
        template=attrs[ATTR_TEMPLATE],
        profile=attrs[ATTR_PROFILE],
        sampler=attrs.get(ATTR_SAMPLER, "tpe"),
        seed=attrs.get(ATTR_SEED),
        budget=attrs.get(ATTR_BUDGET),
        objective=attrs.get(ATTR_OBJECTIVE, "time"),
        early_stop=attrs.get(ATTR_EARLY_STOP),
    )


def counts_toward_budget(trial: FrozenTrial) -> bool:
    """Finished trials count; one abandoned by an interrupted search, pruned as infeasible, or a repeat
    of a point the study held, does not."""
    if trial.user_attrs.get(ATTR_REPEAT):
        return False
    if trial.state == TrialState.PRUNED:
        return not trial.user_attrs.get(ATTR_INFEASIBLE)
    if trial.state == TrialState.COMPLETE:
        return True
    return trial.state == TrialState.FAIL and not trial.user_attrs.get(ATTR_INTERRUPTED)


def finished_trials(study: optuna.Study) -> int:
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    return sum(1 for t in trials if counts_toward_budget(t))
