"""Small pieces every write of the store uses: portable values, and get-or-create under concurrent writers."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dataclasses import replace

from tuner.problem import Problem
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing


def text(value: Optional[str]) -> Optional[str]:
    """PostgreSQL text cannot hold NUL characters; replace them on every backend alike."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def num(value: Optional[float]) -> Optional[float]:
    """NaN is stored as NULL (SQLite does so anyway); infinities are kept."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def figures(energy: Optional[Energy], isolated_us: Optional[float] = None) -> dict[str, Optional[float]]:
    """The energy and isolated-timing columns of a timing row (trials, baselines, confirm timings)."""
    return {"joules_per_call": num(energy.joules_per_call) if energy else None,
            "power_w": num(energy.power_w) if energy else None,
            "sm_mhz": num(energy.sm_mhz) if energy else None, "isolated_us": num(isolated_us)}


def stored(timing: Optional[Timing]) -> Optional[Timing]:
    """The Timing as its columns keep it (num: NaN is NULL; a NaN median, no timing)."""
    if timing is None or num(timing.median_us) is None:
        return None
    e = timing.energy
    energy = None if e is None or num(e.joules_per_call) is None or num(e.power_w) is None else \
        replace(e, joules_per_call=num(e.joules_per_call), power_w=num(e.power_w), sm_mhz=num(e.sm_mhz))
    return replace(timing, median_us=num(timing.median_us), p20_us=num(timing.p20_us), p80_us=num(timing.p80_us),
                   energy=energy, isolated_us=num(timing.isolated_us))


def tflops(problem: Problem, tflops: Optional[float], median_us: Optional[float]) -> Optional[float]:
    if tflops is not None:
        return num(tflops)
    if median_us is not None and math.isfinite(median_us) and median_us > 0:
        return problem.tflops(median_us)
    return None


def upsert_insert(session: Session, model: type) -> Any:
    """The dialect's INSERT with ON CONFLICT support, or None."""
    name = session.get_bind().dialect.name
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    elif name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        return None
    return dialect_insert(model)


def get_or_create(session: Session, model: type, values: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    """Id of the row with these key values, inserting it if missing; safe under concurrent writers.

    On PostgreSQL a concurrent insert of the same key makes ON CONFLICT DO NOTHING
    wait for it, and the following SELECT (a new snapshot) sees it. SQLite write
    transactions are serialised (BEGIN IMMEDIATE), so no race is possible there.
    """
    where = [getattr(model, key) == values[key] for key in keys]
    found = session.scalar(select(model.id).where(*where))
    if found is not None:
        return found
    stmt = upsert_insert(session, model)
    if stmt is not None:
        # The conflict target by column (an attribute may map a column of another name: problems' `pass`).
        columns = [model.__mapper__.columns[key] for key in keys]
        session.execute(stmt.values(**values).on_conflict_do_nothing(index_elements=columns))
    else:
        try:
            with session.begin_nested():
                session.execute(insert(model).values(**values))
        except IntegrityError:
            pass
    found = session.scalar(select(model.id).where(*where))
    assert found is not None, f"{model.__tablename__} row vanished after insert"
    return found
