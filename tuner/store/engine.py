"""Store URLs, engine creation (SQLite pragmas, PostgreSQL timeouts) and the schema version.

Every failure a user can cause (bad URL, unwritable path, unreachable server,
old schema) becomes a one-line TunerError; no password is ever put in a message.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Optional

import sqlalchemy.exc
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url

from tuner.assets import asset_dir
from tuner.errors import TunerError
from tuner.store.models import Base
from tuner.store.redact import redact_text, redacted, secrets_of

APP_NAME = "flashcore-tuner"
SQLITE_BUSY_TIMEOUT_MS = 60_000
PG_CONNECT_TIMEOUT_S = 5
# Execution option that makes a SQLite transaction take the write lock at BEGIN
# (BEGIN IMMEDIATE), so that concurrent writers queue on the busy timeout
# instead of failing when a read lock cannot be upgraded.
WRITE_OPTION = "tuner_write"
# Arbitrary key of the PostgreSQL advisory lock held while creating/upgrading the schema (the store's
# migrations, and Optuna's tables: tuner.store.optuna_tables).
PG_SCHEMA_LOCK = 0x7475_6E65


def default_db_url() -> str:
    """TUNER_DB if set, else a SQLite file in the user's data folder."""
    env = os.environ.get("TUNER_DB")
    if env:
        return env
    try:
        from platformdirs import user_data_dir

        folder = Path(user_data_dir(APP_NAME))
    except ImportError:  # platformdirs is a dependency; this is only a safety net
        folder = Path.home() / ".local" / "share" / APP_NAME
    return f"sqlite:///{folder / 'results.db'}"


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url.strip())
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        # SQLAlchemy's message repeats the raw string, password included: say it ourselves.
        raise TunerError(
            "malformed database URL: expected sqlite:///path/to/results.db or postgresql://user@host[:port]/dbname"
        ) from None
    if parsed.drivername in ("postgres",) or parsed.drivername.startswith("postgres+"):
        parsed = parsed.set(drivername="postgresql" + parsed.drivername[len("postgres") :])
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername=f"postgresql+{_installed_pg_driver()}")
    return parsed


def _installed_pg_driver() -> str:
    """psycopg (3) if installed, else psycopg2 (SQLAlchemy's default differs between 2.0 and 2.1)."""
    from importlib.util import find_spec

    for module in ("psycopg", "psycopg2"):
        if find_spec(module) is not None:
            return module
    return "psycopg2"


def scrub(message: str, url: URL) -> str:
    """First line of a driver message, with the URL's secrets removed should they appear."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    first = lines[0] if lines else "unknown error"
    for secret in secrets_of(url):
        first = first.replace(secret, "***")
    return redact_text(first)


def db_error_message(exc: BaseException, url: URL) -> str:
    orig = getattr(exc, "orig", None)
    return scrub(str(orig if orig is not None else exc), url)


def parse_url(url: str) -> URL:
    """A database URL parsed, or a one-line TunerError (the password never shown)."""
    return _parse(url)


def sqlite_file(url: URL) -> Optional[str]:
    """The file of a file-backed SQLite URL; None for in-memory SQLite and other backends."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return database


def _prepare_sqlite_path(url: URL, create: bool = True) -> URL:
    database = sqlite_file(url)
    if database is None:
        return url
    path = Path(os.path.expanduser(database))
    if path.is_dir():
        raise TunerError(f"results store path {path} is a directory, not a SQLite file")
    if not create:  # a reader must not leave folders behind for a store that is not there
        if not path.exists():
            raise TunerError(f"no results store at {path} (`tuner search` or `tuner db upgrade` creates one)")
        return url.set(database=str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunerError(
            f"cannot create folder {path.parent} for the results store: {exc.strerror or exc}"
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise TunerError(f"results store folder {path.parent} is not writable")
    return url.set(database=str(path))


def _install_sqlite_hooks(engine: Engine, writer: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy (below) emit BEGIN, instead of pysqlite's implicit one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if writer:  # WAL changes the file: never for a reader (a file that is not ours, read-only media)
                try:
                    cursor.execute("PRAGMA journal_mode = WAL")
                    cursor.execute("PRAGMA synchronous = NORMAL")
                except Exception:  # an odd file system: keep the default journal
                    pass
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_store_engine(url: str, create: bool = True) -> tuple[Engine, URL]:
    """An Engine for `url` with the project's connection settings (does not connect).

    With create=False a SQLite file that does not exist is an error (and no
    folder is made for it).
    """
    parsed = _parse(url)
    backend = parsed.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        parsed = _prepare_sqlite_path(parsed, create)
        # check_same_thread off: the journal's one connection serves the heartbeat thread too (under a lock)
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        readonly = _readonly_sqlite_uri(parsed, create)
        if readonly is not None:
            kwargs["creator"] = readonly
    elif backend == "postgresql":
        driver = parsed.get_driver_name()
        if driver in ("psycopg2", "psycopg") and "connect_timeout" not in parsed.query:
            kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except sqlalchemy.exc.NoSuchModuleError:
        raise TunerError(f"unsupported database URL scheme {parsed.drivername!r}; use sqlite:/// or postgresql://") from None
    except ImportError as exc:
        hint = " (pip install 'flashcore-tuner[postgres]')" if backend == "postgresql" else ""
        raise TunerError(f"database driver for {parsed.drivername!r} is not installed: {exc.name or exc}{hint}") from None
    except sqlalchemy.exc.ArgumentError as exc:
        raise TunerError(f"invalid database URL {redacted(parsed)}: {scrub(str(exc), parsed)}") from None
    if backend == "sqlite":
        _install_sqlite_hooks(engine, writer=create)
    return engine, parsed


def _readonly_sqlite_uri(url: URL, create: bool) -> Optional[Any]:
    """For a reader of a store in a folder it cannot write (read-only media, a shared archive): a
    connection factory opening the file immutable, since SQLite cannot otherwise read a WAL-mode
    file there. None where the folder is writable (or the store is to be written)."""
    database = sqlite_file(url)
    if create or database is None or os.access(os.path.dirname(database) or ".", os.W_OK):
        return None
    uri = Path(database).resolve().as_uri() + "?mode=ro&immutable=1"
    return lambda: sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False)


# --- schema version (Alembic) ---------------------------------------------------------------


def migrations_dir() -> Path:
    return asset_dir("db")


def alembic_config(connection: Optional[Connection] = None):  # -> alembic.config.Config
    """An Alembic Config built in code: script_location is the shipped db/ folder."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "db/versions holds no migration"
    return head


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(conn: Connection) -> Optional[str]:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def has_tables(conn: Connection) -> bool:
    existing = set(inspect(conn).get_table_names())
    return bool(existing & set(Base.metadata.tables))


def _lock_for_migration(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_SCHEMA_LOCK})


def migrate(engine: Engine, target: str = "head", *, downgrade: bool = False) -> None:
    """Run the migrations up (or, with downgrade, down) to `target` in one transaction (serialised
    between processes). A downgrade that would delete data is refused first, naming all of it."""
    from alembic import command
    from alembic.script import ScriptDirectory

    from tuner.store.downgrade import path_losses, refuse_losses

    with engine.connect() as conn:
        conn.execution_options(**{WRITE_OPTION: True})
        sqlite = conn.dialect.name == "sqlite"
        # SQLite batch mode rebuilds a table by copy, drop and rename: with foreign keys enforced, dropping a
        # parent (problems) fails. The pragma is ignored inside a transaction: off before BEGIN (the
        # connection is in autocommit mode until then), on again after. Rows a rebuild left pointing nowhere
        # roll the migration back.
        if sqlite:
            conn.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            with conn.begin():
                _lock_for_migration(conn)
                if downgrade:
                    scripts = ScriptDirectory.from_config(alembic_config())
                    refuse_losses(conn, target, path_losses(scripts, current_revision(conn), target))
                dangling = sqlite and conn.exec_driver_sql("PRAGMA foreign_key_check").first() is not None
                (command.downgrade if downgrade else command.upgrade)(alembic_config(conn), target)
                if sqlite and not dangling and conn.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                    raise TunerError("the migration left rows whose foreign keys point nowhere; rolled back")
        finally:
            if sqlite:
                conn.connection.driver_connection.execute("PRAGMA foreign_keys = ON")


def _read_schema_state(conn: Connection) -> tuple[Optional[str], bool]:
    revision = current_revision(conn)
    return revision, revision is None and has_tables(conn)


def schema_state(engine: Engine, head: str) -> tuple[Optional[str], bool]:
    """The store's schema revision, and whether tuner tables exist without one. Another process creating
    the store may commit between the two reads (no revision yet, then its tables), so a state short of
    `head` (head_revision()) is read again once any migration in flight has committed."""
    with engine.connect() as conn:
        state = _read_schema_state(conn)
        conn.rollback()
        if state[0] != head:
            with conn.begin():
                _lock_for_migration(conn)
                state = _read_schema_state(conn)
    return state


def unversioned_tables_error(url: URL) -> TunerError:
    return TunerError(
        f"the database at {redacted(url)} holds tuner tables without a schema revision; "
        "it was not created by this tool"
    )


def check_schema(engine: Engine, url: URL, *, create: bool) -> str:
    """Make sure the schema is at head: create it on a new database, refuse an old one."""
    head = head_revision()
    revision, tables = schema_state(engine, head)
    where = redacted(url)
    if revision == head:
        return head
    if revision is None and not tables:
        if not create:
            raise TunerError(f"no results store at {where} (it holds no tuner tables)")
        migrate(engine)
        return head
    if revision is None:
        raise unversioned_tables_error(url)
    if revision not in known_revisions():
        raise TunerError(
            f"the results store at {where} has schema revision {revision}, unknown to this tuner "
            "(written by a newer version?); upgrade flashcore-tuner"
        )
    raise TunerError(
        f"the results store at {where} has schema revision {revision}, this tuner needs {head}; "
        "run `tuner db upgrade` to migrate it"
    )


def translate_errors(url: URL, action: str) -> "_ErrorTranslator":
    return _ErrorTranslator(url, action)


class _ErrorTranslator:
    """Context manager: database and OS errors become one-line TunerErrors."""

    def __init__(self, url: URL, action: str) -> None:
        self.url = url
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], _tb: Any) -> bool:
        if exc is None or isinstance(exc, TunerError):
            return False
        where = redacted(self.url)
        if isinstance(exc, sqlalchemy.exc.DBAPIError):
            raise TunerError(f"{self.action} ({where}): {db_error_message(exc, self.url)}") from None
        if isinstance(exc, (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error)):  # sqlite3: the journal's raw connection
            raise TunerError(f"{self.action} ({where}): {scrub(str(exc), self.url)}") from None
        if isinstance(exc, OSError):
            raise TunerError(f"{self.action} ({where}): {exc.strerror or exc}") from None
        return False

