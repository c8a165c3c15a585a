"""A store's schema: which revision it is at, migrating it to the newest, and back to an older one."""

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


def _revisions_oldest_first() -> list[str]:
    from alembic.script import ScriptDirectory

    return [s.revision for s in ScriptDirectory.from_config(eng.alembic_config()).walk_revisions()][::-1]


def downgrade_store(url: Optional[str], target: str) -> tuple[str, str]:
    """Take the store at `url` (default: the default store) back to schema revision `target` ("base": no
    schema), refused in one line, before anything changes, where that would delete data
    (tuner.store.downgrade.refuse_losses) or `target` is not older than the store's revision.
    Returns (before, after)."""
    order = _revisions_oldest_first()
    target = target.strip()
    if target != "base" and target not in order:
        raise TunerError(f"unknown schema revision {target!r}; known: {', '.join(order)} (or base: no schema)")
    engine, parsed = eng.create_store_engine(url if url is not None else eng.default_db_url(), create=False)
    try:
        with eng.translate_errors(parsed, "cannot downgrade the results store"):
            before, unversioned = eng.schema_state(engine, eng.head_revision())
            if unversioned:
                raise eng.unversioned_tables_error(parsed)
            if before is None:
                raise TunerError(f"{redacted(parsed)} has no schema yet: there is nothing to downgrade")
            if before not in order:
                raise TunerError(f"schema revision {before} is unknown to this tuner (written by a newer version?)")
            if target == before:
                return before, before
            if target != "base" and order.index(target) > order.index(before):
                raise TunerError(f"revision {target} is newer than the store's {before}: run `tuner db upgrade`")
            eng.migrate(engine, target, downgrade=True)  # refuses a loss first (refuse_losses), in its transaction
            with engine.connect() as conn:
                after = eng.current_revision(conn)
        return before, after or "base"
    finally:
        engine.dispose()
