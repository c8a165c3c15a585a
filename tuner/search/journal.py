"""Optuna's journal kept inside a SQLite results store, so that a store is one file.

Optuna's JournalStorage replays an ordered log of operations. Here each log
is a row of the store's `optuna_journal` table, appended in one transaction
(SQLite serialises writers, so the order of the rows is the order of the
appends across processes): a crash or a full disk leaves the journal as it
was, never half a record, and copying the store copies its studies.

Stores made before the journal moved in kept it in a file next to them
(results.db.optuna.journal). Such a file is imported into an empty journal
once, and renamed so it is not read again; a torn last line (a write cut off
by a full disk or a kill) is dropped, and damage anywhere else is refused.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Iterable, Optional

from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend

from tuner.errors import TunerError
from tuner.search.ownership import OwnedTrials, sqlite_identity
from tuner.store import Store

LEGACY_SUFFIX = ".optuna.journal"
IMPORTED_SUFFIX = ".imported"


class StoreJournalBackend(BaseJournalBackend):
    """A JournalStorage backend on the results store's `optuna_journal` table."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._read = 0  # lines returned so far, the last of them row `_last_id`
        self._last_id: Optional[int] = None

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        # JournalStorage asks for the lines after those it has replayed, before every read: the rows
        # after the last one returned are those (SQLite gives appended rows increasing ids, in commit order).
        follows = log_number_from == self._read and (self._last_id is not None or log_number_from == 0)
        rows = self._store.journal_rows(after_id=self._last_id if follows else None, offset=log_number_from)
        if rows:
            self._read, self._last_id = log_number_from + len(rows), rows[-1][0]
        elif not follows:
            self._read, self._last_id = log_number_from, None
        return [json.loads(line) for _, line in rows]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._store.append_journal([json.dumps(log, separators=(",", ":")) for log in logs])


class StoreJournalStorage(OwnedTrials, JournalStorage):
    """Optuna's JournalStorage on a results store's journal, creating owned trials (tuner.search.ownership);
    close() releases the store."""

    def __init__(self, store: Store, path: Optional[str] = None) -> None:
        super().__init__(StoreJournalBackend(store))
        self._store = store
        self.store_identity = sqlite_identity(path) if path is not None else None  # the file `path` (the store's)

    def close(self) -> None:
        self._store.close()


def legacy_journal_lines(path: str) -> list[str]:
    """The complete records of a journal file; a torn last line is dropped (with a warning)."""
    with open(path, "rb") as handle:
        raw = handle.read().split(b"\n")
    lines = [line for line in raw if line.strip()]
    complete: list[str] = []
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except ValueError:
            if number == len(lines):
                warnings.warn(f"{path}: dropped a torn last record (a write cut off by a full disk or a kill)",
                              RuntimeWarning, stacklevel=2)
                break
            raise TunerError(f"{path}: record {number} of {len(lines)} is damaged; the journal cannot be imported") from None
        complete.append(line.decode())
    return complete


def import_legacy_journal(store: Store, database: str) -> None:
    """Move the journal file next to a SQLite store into the store, once (see the module doc)."""
    path = database + LEGACY_SUFFIX
    if not os.path.exists(path):
        return
    try:
        lines = legacy_journal_lines(path)
    except FileNotFoundError:  # another process imported and renamed it meanwhile
        return
    # The emptiness check and the append are one transaction: two processes opening an old store at
    # once cannot both import it. A store that already has its journal leaves the file a leftover.
    if lines and not store.append_journal_if_empty(lines):
        return
    try:
        os.replace(path, path + IMPORTED_SUFFIX)
    except FileNotFoundError:
        return  # renamed by another process
    except OSError as exc:
        raise TunerError(f"imported {path} into the store but cannot rename it: {exc.strerror or exc}") from None
