"""What going back to an older schema revision would delete, and the refusal of such a downgrade.

Each migration in db/versions names, in LOSES, the data its downgrade() drops: a description and
the SQL that counts it (a whole table, or the values of a column the older schema cannot hold).
A downgrade is refused, before anything changes, while any of that data is there, in one line
naming all of it; a store without such data goes down and up freely. `tuner db downgrade REVISION`
(tuner.store.schema.downgrade_store) and alembic's own CLI (db/env.py) refuse alike, in one line.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from sqlalchemy import Connection, text

from tuner.errors import TunerError

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

