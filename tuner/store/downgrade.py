"""What going back to an older schema revision would delete, and the refusal of such a downgrade.

Each migration in db/versions names, in LOSES, the data its downgrade() drops: a description and
the SQL that counts it (a whole table, or the values of a column the older schema cannot hold).
A downgrade is refused, before anything changes, while any of that data is there, in one line
naming all of it; a store without such data goes down and up freely. `tuner db downgrade REVISION`
(downgrade_store) and alembic's own CLI (db/env.py) refuse alike, in one line.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from sqlalchemy import Connection, text

from tuner.errors import TunerError
from tuner.store.redact import redacted

Losses = Mapping[str, str]  # what is lost (plural noun) -> SELECT COUNT(*) of it


def held(conn: Connection, losses: Losses) -> list[str]:
    """'description (count)' for each loss that holds data now."""
    found = []
    for what, count_sql in losses.items():
        count = conn.execute(text(count_sql)).scalar_one()
        if count:
            found.append(f"{what} ({count})")
    return found


def refuse_losses(conn: Connection, target: Optional[str], losses: Losses) -> None:
    """TunerError naming the data that going back to `target` would delete, if there is any."""
    found = held(conn, losses)
    if found:
        where = "an empty schema" if target in (None, "base") else f"revision {target}"
        raise TunerError(f"the results store cannot go back to {where}: that would delete {', '.join(found)}; "
                         "nothing was changed")


def path_losses(scripts: Any, current: Optional[str], target: str) -> dict[str, str]:
    """The LOSES of every migration (of the alembic ScriptDirectory `scripts`) that a downgrade from
    `current` to `target` undoes, newest first."""
    if current is None:
        return {}
    merged: dict[str, str] = {}
    for script in scripts.iterate_revisions(current, target):
        merged.update(getattr(script.module, "LOSES", {}))
    return merged


def _revisions_oldest_first() -> list[str]:
    from alembic.script import ScriptDirectory

    from tuner.store import engine as eng

    return [s.revision for s in ScriptDirectory.from_config(eng.alembic_config()).walk_revisions()][::-1]


def downgrade_store(url: Optional[str], target: str) -> tuple[str, str]:
    """Take the store at `url` (default: the default store) back to schema revision `target` ("base": no
    schema), refused in one line, before anything changes, where that would delete data (refuse_losses)
    or `target` is not older than the store's revision. Returns (before, after)."""
    from tuner.store import engine as eng

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
