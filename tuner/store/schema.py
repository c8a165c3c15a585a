"""A store's schema: which revision it is at, and migrating it to the newest."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from tuner.errors import TunerError
from tuner.store import engine as eng
from tuner.store.optuna_tables import create_optuna_tables
from tuner.store.redact import redacted


@dataclass(frozen=True)
class StoreInfo:
    url: str  # redacted
    backend: str
    revision: Optional[str]
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.revision == self.head


def store_info(url: Optional[str] = None) -> StoreInfo:
    """URL, backend and schema revision of a store, whatever its revision; creates nothing."""
    text = url if url is not None else eng.default_db_url()
    parsed = eng.parse_url(text)
    database = eng.sqlite_file(parsed) if parsed.get_backend_name() == "sqlite" else None
    if database is not None and not os.path.exists(os.path.expanduser(database)):
        return StoreInfo(redacted(parsed), "sqlite", None, eng.head_revision())
    engine, parsed = eng.create_store_engine(text, create=False)
    try:
        with eng.translate_errors(parsed, "cannot open the results store"), engine.connect() as conn:
            revision = eng.current_revision(conn)
        return StoreInfo(redacted(parsed), engine.dialect.name, revision, eng.head_revision())
    finally:
        engine.dispose()


def upgrade_store(url: Optional[str] = None) -> tuple[Optional[str], str]:
    """Migrate a store (or create a new one) to the newest revision; returns (before, after)."""
    engine, parsed = eng.create_store_engine(url if url is not None else eng.default_db_url())
    try:
        with eng.translate_errors(parsed, "cannot upgrade the results store"):
            before, unversioned = eng.schema_state(engine, eng.head_revision())
            if unversioned:
                raise eng.unversioned_tables_error(parsed)
            if before is not None and before not in eng.known_revisions():
                raise TunerError(
                    f"schema revision {before} is unknown to this tuner (written by a newer version?)"
                )
            eng.migrate(engine)
            with engine.connect() as conn:
                after = eng.current_revision(conn)
            if engine.dialect.name == "postgresql":  # Optuna's tables too: a first search need not create them
                create_optuna_tables(parsed.render_as_string(hide_password=False))
        assert after is not None
        return before, after
    finally:
        engine.dispose()
