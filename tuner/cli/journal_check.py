"""Is the store's Optuna journal intact? Asked by the commands that show what is stored.

`tuner results`, `show`, `report` and `export` read the trials table, not the journal
(tuner.search.journal), so bytes damaged in the journal's pages went unnoticed until
`tuner search --resume` failed on them. These commands now say so in one warning line:
what they show is still read from the trials table, but the studies behind it cannot be
continued (and the report has no parameter importance for them).

On SQLite the check costs one b-tree check of the journal table and one scan in SQL
(0.3 s for a journal of 9,000 trials); elsewhere the journal is read and parsed.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Optional

from sqlalchemy.engine import make_url

from tuner.cli.state import say
from tuner.errors import TunerError
from tuner.store import Store, open_store

TABLE = "optuna_journal"
# Every record is json.dumps(...) with ensure_ascii: a byte outside printable ASCII is damage.
_DAMAGED_ROW = (f"SELECT id FROM {TABLE} WHERE typeof(log) != 'text' OR log GLOB '*[^ -~]*' OR NOT json_valid(log) "
                "ORDER BY id LIMIT 1")
_PAGE = re.compile(r"\bpage (\d+)")


def _sqlite_damage(path: str) -> Optional[str]:
    """The damage SQLite itself finds in the journal table of the file at `path` (read-only)."""
    file = Path(path).resolve()
    # A folder this process cannot write (read-only media): SQLite reads a WAL-mode file there only immutable.
    immutable = "" if os.access(file.parent, os.W_OK) else "&immutable=1"
    conn = sqlite3.connect(file.as_uri() + "?mode=ro" + immutable, uri=True)
    try:
        try:
            found = [row[0] for row in conn.execute(f"PRAGMA quick_check({TABLE})").fetchall()]
        except sqlite3.DatabaseError as exc:  # a page too damaged to check: where reading stops
            return _unreadable_after(conn, exc)
        if found != ["ok"]:
            pages = sorted({int(p) for text in found for p in _PAGE.findall(str(text))})
            listed = ", ".join(map(str, pages[:5])) + (f" and {len(pages) - 5} more" if len(pages) > 5 else "")
            return f"SQLite pages {listed} of its table fail SQLite's check" if pages else \
                f"SQLite's check of its table fails: {str(found[0]).splitlines()[-1]}"
        row = conn.execute(_DAMAGED_ROW).fetchone()
        return None if row is None else f"record {row[0]} is not the JSON the search wrote"
    finally:
        conn.close()


def _unreadable_after(conn: sqlite3.Connection, exc: sqlite3.DatabaseError) -> str:
    """Where a scan of the journal in record order stops (SQLite's check itself gave up with `exc`)."""
    last = None
    try:
        for row_id, _length in conn.execute(f"SELECT id, length(log) FROM {TABLE} ORDER BY id"):  # reads each record
            last = row_id
    except sqlite3.DatabaseError as scan:
        where = "from its first record" if last is None else f"after record {last}"
        return f"SQLite cannot read it {where}: {scan}"
    return f"SQLite's check of its table fails: {exc}"


def _read_damage(store: Store) -> Optional[str]:
    """The damage found by reading every record as Optuna does (any backend)."""
    try:
        rows = store.journal_rows()
    except TunerError as exc:
        return str(exc)
    for row_id, line in rows:
        try:
            json.loads(line)
        except ValueError:
            return f"record {row_id} is not the JSON the search wrote"
    return None


def journal_damage(store: Store) -> Optional[str]:
    """None when the store's Optuna journal is intact; else what is damaged, in a few words."""
    if store.backend == "sqlite":
        database = make_url(store.url).database
        if database and database != ":memory:":
            try:
                return _sqlite_damage(database)
            except sqlite3.OperationalError:  # cannot open it so, or an SQLite without json_valid: read it instead
                pass
            except sqlite3.DatabaseError as exc:  # "malformed", "not a database"
                return f"SQLite cannot read it: {exc}"
    return _read_damage(store)


def warn_if_journal_damaged(store: Store) -> None:
    """One warning line on stderr when the store's journal is damaged (see the module doc)."""
    damage = journal_damage(store)
    if damage:
        say(f"warning: the Optuna journal in {store.url} is damaged ({damage}): its studies cannot be continued "
            "(`tuner search --resume`); what is shown is read from the trials table", stderr=True)


def warn_if_journal_damaged_at(db_url: Optional[str]) -> None:
    """warn_if_journal_damaged for the store at `db_url`; a store that cannot be opened is left to the
    command, which says why in its own words."""
    try:
        store = open_store(db_url, create=False)
    except TunerError:
        return
    with store:
        warn_if_journal_damaged(store)
