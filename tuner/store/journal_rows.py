"""Optuna's journal rows in a results store, read and appended with as little overhead as the driver allows.

A search appends a few thousand journal lines and Optuna reads the journal
before every sampler decision, so each of these operations must cost
microseconds, not the half millisecond of an ORM session or a pooled Core
connection (checkout, BEGIN, statement cache, ROLLBACK). On SQLite one DBAPI
connection is kept for them (the pool's on-connect settings applied: busy
timeout, WAL); elsewhere Core statements do the same work.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from sqlalchemy import Engine, insert, select
from sqlalchemy.engine import URL

from tuner.store import engine as eng
from tuner.store.models import OptunaJournalTable

_TABLE = OptunaJournalTable.__tablename__


class JournalRows:
    """The `optuna_journal` table of one store: (id, line) rows in append order."""

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine, self._url = engine, url
        self._sqlite = engine.dialect.name == "sqlite"
        self._raw: Any = None  # the SQLite DBAPI connection, opened on first use
        self._lock = threading.Lock()  # one connection, several threads (the heartbeat writes too)

    def rows(self, *, after_id: Optional[int] = None, offset: int = 0) -> list[tuple[int, str]]:
        """Rows after row `after_id` when given, else from line number `offset` (0-based) on."""
        with eng.translate_errors(self._url, "cannot read the Optuna journal"):
            if not self._sqlite:
                return self._core_rows(after_id, offset)
            if after_id is not None:
                sql, args = f"SELECT id, log FROM {_TABLE} WHERE id > ? ORDER BY id", (after_id,)
            else:
                sql, args = f"SELECT id, log FROM {_TABLE} ORDER BY id LIMIT -1 OFFSET ?", (offset,)
            with self._lock:
                cursor = self._connection().cursor()
                try:
                    cursor.execute(sql, args)
                    return [(row[0], row[1]) for row in cursor.fetchall()]
                finally:
                    cursor.close()

    def append(self, lines: list[str], *, only_if_empty: bool = False) -> bool:
        """Append `lines` in one write transaction (all or none); with only_if_empty, only to an empty
        journal (the check and the append are that one transaction). True when appended."""
        with eng.translate_errors(self._url, "cannot write the Optuna journal"):
            if not self._sqlite:
                return self._core_append(lines, only_if_empty)
            with self._lock:
                cursor = self._connection().cursor()
                try:
                    cursor.execute("BEGIN IMMEDIATE")  # take the write lock now: writers queue on the busy timeout
                    try:
                        if only_if_empty and cursor.execute(f"SELECT 1 FROM {_TABLE} LIMIT 1").fetchone():
                            cursor.execute("ROLLBACK")
                            return False
                        cursor.executemany(f"INSERT INTO {_TABLE} (log) VALUES (?)", [(line,) for line in lines])
                        cursor.execute("COMMIT")
                    except BaseException:
                        cursor.execute("ROLLBACK")
                        raise
                    return True
                finally:
                    cursor.close()

    def close(self) -> None:
        with self._lock:
            if self._raw is not None:
                self._raw.close()  # back to the pool, which the store's engine disposes
                self._raw = None

    def _connection(self) -> Any:
        if self._raw is None:
            self._raw = self._engine.raw_connection()
        return self._raw

    def _core_rows(self, after_id: Optional[int], offset: int) -> list[tuple[int, str]]:
        stmt = select(OptunaJournalTable.id, OptunaJournalTable.log).order_by(OptunaJournalTable.id)
        stmt = stmt.where(OptunaJournalTable.id > after_id) if after_id is not None else stmt.offset(offset)
        with self._engine.connect() as conn:
            return [(row[0], row[1]) for row in conn.execute(stmt)]

    def _core_append(self, lines: list[str], only_if_empty: bool) -> bool:
        with self._engine.execution_options(**{eng.WRITE_OPTION: True}).begin() as conn:
            if only_if_empty and conn.execute(select(OptunaJournalTable.id).limit(1)).first() is not None:
                return False
            conn.execute(insert(OptunaJournalTable), [{"log": line} for line in lines])
            return True
