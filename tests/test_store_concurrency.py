"""Several processes writing into one store at once: no lost row, no error."""

from __future__ import annotations

import multiprocessing
import time

from store_factories import BIG, H100, SMALL, trial

from tuner.store import TrialFilter, open_store

PROCESSES = 4
TRIALS_EACH = 200


def _writer(url: str, worker: int) -> int:
    """Write TRIALS_EACH trials; problems and variants overlap between workers (get-or-create races)."""
    with open_store(url) as store:
        run = store.start_run(H100)
        for i in range(TRIALS_EACH):
            problem = BIG if i % 2 else SMALL
            params = {"BLOCK_M": 64 * (1 + i % 4), "BLOCK_N": 64, "STAGES": 1 + (i // 4) % 5}
            store.add_trial(trial(run, problem, params=params, median_us=50.0 + i + worker / 10, trial_number=i,
                                  study=f"worker{worker}"))  # fmt: skip
            if i % 50 == 0:
                store.problem_id(problem)
        store.finish_run(run)
        return run


def test_concurrent_writers(store_url):
    # The parent creates the schema first, as `tuner search` does before starting workers.
    open_store(store_url).close()
    started = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        runs = pool.starmap(_writer, [(store_url, w) for w in range(PROCESSES)])
    elapsed = time.monotonic() - started
    assert len(set(runs)) == PROCESSES
    with open_store(store_url) as store:
        rows = store.query_trials(TrialFilter())
        assert len(rows) == PROCESSES * TRIALS_EACH
        assert {r.run_id for r in rows} == set(runs)
        for worker in range(PROCESSES):
            numbers = sorted(r.trial_number for r in rows if r.study == f"worker{worker}")
            assert numbers == list(range(TRIALS_EACH))
        # 2 problems x 20 parameter combinations, each stored once whatever the races.
        assert len({r.problem_id for r in rows}) == 2
        assert len({r.variant_id for r in rows}) == 20
    assert elapsed < 60, f"{PROCESSES}x{TRIALS_EACH} concurrent trials took {elapsed:.1f} s"


def _opener(url: str, worker: int) -> int:
    with open_store(url) as store:
        run = store.start_run(H100)
        for i in range(10):
            store.add_trial(trial(run, params={"i": i}, trial_number=i, study=f"w{worker}"))
        return run


def test_concurrent_creation_of_a_new_store(store_url):
    """Processes that all find an empty database create the schema once (lock), then write."""
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        pool.starmap(_opener, [(store_url, w) for w in range(PROCESSES)])
    with open_store(store_url) as store:
        rows = store.query_trials(TrialFilter())
        assert len(rows) == PROCESSES * 10 and len({r.variant_id for r in rows}) == 10


def _rival_creates_the_store_after_the_revision_read(monkeypatch, url: str) -> list[bool]:
    """From the first schema read on, another process (here: a nested open) has committed the new schema
    after this one found no revision but before it looked for tables."""
    from tuner.store import engine as eng

    real_revision = eng.current_revision
    created: list[bool] = []

    def revision_then_a_rival_creates_the_store(conn):
        revision = real_revision(conn)
        if not created:
            created.append(True)
            open_store(url).close()
        return revision

    monkeypatch.setattr(eng, "current_revision", revision_then_a_rival_creates_the_store)
    return created


def test_a_store_created_between_the_schema_reads_opens(store_url, monkeypatch):
    """The race the concurrent-creation test hits at random, made certain: the open sees a store at head."""
    created = _rival_creates_the_store_after_the_revision_read(monkeypatch, store_url)
    with open_store(store_url) as store:
        run = store.start_run(H100)
        store.add_trial(trial(run, params={"i": 0}, trial_number=0, study="late"))
        assert len(store.query_trials(TrialFilter())) == 1
    assert created


def test_an_upgrade_racing_the_store_creation_finds_it_at_head(store_url, monkeypatch):
    from tuner.store.engine import head_revision
    from tuner.store.schema import upgrade_store

    created = _rival_creates_the_store_after_the_revision_read(monkeypatch, store_url)
    assert upgrade_store(store_url) == (head_revision(), head_revision())
    assert created
