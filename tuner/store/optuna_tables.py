"""Optuna's tables in a PostgreSQL results store: created once, by one process at a time.

Optuna's RDBStorage creates its tables (and its version rows) on first use by checking which exist and
creating the missing ones, which is no transaction against another process doing the same: several
processes opening a fresh database at once collided ("duplicate key value violates unique constraint
pg_type_typname_nsp_index"). Every opening therefore happens under the advisory lock that guards the
results store's own migrations; `tuner db upgrade` creates Optuna's tables too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import create_engine, text

from tuner.store.engine import PG_CONNECT_TIMEOUT_S, PG_SCHEMA_LOCK

OPTUNA_PG_SCHEMA = "optuna"  # Optuna's tables live apart from the results store's (both have `trials`)

RDB = TypeVar("RDB")


def optuna_engine_kwargs() -> dict[str, Any]:
    """The engine settings of Optuna's RDBStorage on a results store: its own schema, the store's timeouts."""
    return {
        "connect_args": {"connect_timeout": PG_CONNECT_TIMEOUT_S, "options": f"-c search_path={OPTUNA_PG_SCHEMA}"},
        "pool_pre_ping": True,
    }


@contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Hold the database's schema lock (a session advisory lock on a connection of its own; a killed
    holder's lock goes with its connection)."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_SCHEMA_LOCK})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_SCHEMA_LOCK})
    finally:
        engine.dispose()


def open_optuna_rdb(url: str, factory: Callable[..., RDB]) -> RDB:
    """`factory(url, engine_kwargs=...)` (an RDBStorage class) on the results store at `url` (a PostgreSQL URL,
    password included), its schema and tables created first where missing, under the schema lock."""
    with schema_lock(url):
        engine = create_engine(url, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
        try:
            with engine.begin() as conn:  # CREATE SCHEMA only where missing: it needs a privilege a user may lack
                if not conn.scalar(text("SELECT 1 FROM pg_namespace WHERE nspname = :n"), {"n": OPTUNA_PG_SCHEMA}):
                    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{OPTUNA_PG_SCHEMA}"'))
        finally:
            engine.dispose()
        return factory(url, engine_kwargs=optuna_engine_kwargs())


def create_optuna_tables(url: str) -> None:
    """Create Optuna's schema and tables in the PostgreSQL store at `url` where missing."""
    import optuna

    open_optuna_rdb(url, optuna.storages.RDBStorage).engine.dispose()
