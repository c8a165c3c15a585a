"""A study's first moments under faults: the Optuna storage's first use by several processes at once,
a kill between creating a study and writing its attributes, and a start that meets a study being created.

Real processes throughout (issue 36, items 1-3): the faults were found with kill -9 and concurrent starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


# --- the Optuna storage's first use on PostgreSQL ---------------------------------------------------

# Opens the Optuna storage of a fresh database. Optuna's table creation checks which tables exist, then
# creates the missing ones; this child waits there (MetaData's before_create, fired after the check and
# before the first CREATE) until every child has checked, or 3 s: without serialisation they all found
# no table and all create them, so all but one collide; serialised, the later ones find every table and
# have nothing to create.
FIRST_USE = """
    import os, sys, time
    from pathlib import Path
    from optuna.storages._rdb import models
    from sqlalchemy import event

    arrived = Path(sys.argv[2])

    @event.listens_for(models.BaseModel.metadata, "before_create")
    def _wait_for_the_others(_metadata, _conn, tables=(), **_kw):
        if not tables:
            return
        (arrived / str(os.getpid())).touch()
        deadline = time.monotonic() + 3.0
        while len(list(arrived.iterdir())) < int(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.01)

    from tuner.search.study import opened_storage
    with opened_storage(sys.argv[1]):
        pass
"""


@pytest.mark.postgres
@pytest.mark.parametrize("first", ["search", "db upgrade"])
def test_first_use_of_a_postgres_store_by_several_processes_at_once(pg_url, tmp_path, first):
    """Every process opens the storage (Optuna's table creation is serialised by an advisory lock), also
    after `tuner db upgrade` alone, which now creates Optuna's tables too."""
    if first == "db upgrade":
        from tuner.store import upgrade_store

        upgrade_store(pg_url)
    arrived = tmp_path / "arrived"
    arrived.mkdir()
    count = 3
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(FIRST_USE), pg_url, str(arrived), str(count)],
                                 cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(count)]
    results = [(child.wait(timeout=120), child.stderr.read()) for child in children]
    for child in children:
        child.stdout.close()
        child.stderr.close()
    assert [rc for rc, _ in results] == [0] * count, "\n".join(err[-1500:] for _, err in results)
    if first == "db upgrade":  # the tables were there: nobody had anything to create
        assert list(arrived.iterdir()) == []
