"""The results store: one object per process, one transaction per write."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from typing import Any, Iterator, Mapping, Optional

from sqlalchemy import Engine, select, update
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.store import engine as eng
from tuner.store import queries as q
from tuner.store.confirmations import ConfirmationStore
from tuner.store.journal_rows import JournalRows
from tuner.store.models import (
    BaselineTable,
    NcuMetricTable,
    ProblemTable,
    RunTable,
    TrialTable,
    VariantTable,
    utcnow,
)
from tuner.store.records import (
    BaselineRecord,
    BaselineRow,
    NcuMetric,
    RunInfo,
    TrialDetail,
    TrialFilter,
    TrialRecord,
    TrialRow,
    TrialStatus,
    canonical_json,
)
from tuner.store.redact import redacted
from tuner.store.writes import get_or_create, num, stored, text, tflops, upsert_insert

_VARIANT_KEYS = ("template", "template_hash", "params_key")


class Store(ConfirmationStore):
    """Results of runs, trials, baselines and ncu metrics in one SQL database.

    Create it with open_store(); each process should open its own.
    """

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._url = url
        self._reads = sessionmaker(engine, expire_on_commit=False)
        self._writes = sessionmaker(engine.execution_options(**{eng.WRITE_OPTION: True}), expire_on_commit=False)
        self._journal = JournalRows(engine, url)

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL with the password hidden."""
        return redacted(self._url)

    @property
    def backend(self) -> str:
        return self._engine.dialect.name

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def close(self) -> None:
        self._journal.close()
        self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    @contextmanager
    def _write(self, action: str) -> Iterator[Session]:
        with eng.translate_errors(self._url, action), self._writes.begin() as session:
            yield session

    @contextmanager
    def _read(self, action: str) -> Iterator[Session]:
        with eng.translate_errors(self._url, action), self._reads() as session:
            yield session

    def current_revision(self) -> Optional[str]:
        with eng.translate_errors(self._url, "cannot read the schema revision"), self._engine.connect() as conn:
            return eng.current_revision(conn)

    def upgrade(self) -> None:
        """Migrate the schema to the newest revision (no-op when already there)."""
        with eng.translate_errors(self._url, "cannot upgrade the results store"):
            eng.migrate(self._engine)

    # --- writes -----------------------------------------------------------------------------

    def start_run(self, info: RunInfo) -> int:
        with self._write("cannot record the run") as session:
            values = {key: text(value) for key, value in asdict(info).items()}
            if values.get("objective") == "time":  # stored as NULL, as a run from before 0007 says it
                values["objective"] = None
            run = RunTable(**values, started_at=utcnow())
            session.add(run)
            session.flush()
            return run.id

    def finish_run(self, run_id: int) -> None:
        with self._write("cannot record the end of the run") as session:
            result = session.execute(update(RunTable).where(RunTable.id == run_id).values(ended_at=utcnow()))
            if result.rowcount == 0:
                raise TunerError(f"no run with id {run_id}")

    def problem_id(self, problem: Problem) -> int:
        """Id of the problem's row, created if missing."""
        values = problem.to_dict()
        with self._read("cannot look up the problem") as session:
            found = session.scalar(select(ProblemTable.id).filter_by(**values))
        if found is not None:
            return found
        with self._write("cannot record the problem") as session:
            return get_or_create(session, ProblemTable, values, q.PROBLEM_KEYS)

    def variant_id(self, template: str, template_hash: str, params: Mapping[str, Any], name: str) -> int:
        """Id of the variant (template, template_hash, params), created with `name` if missing.

        The name is not part of the key: an existing variant keeps the name it was created with.
        """
        values = self._variant_values(template, template_hash, params, name)
        with self._read("cannot look up the variant") as session:
            found = session.scalar(
                select(VariantTable.id).where(*(getattr(VariantTable, key) == values[key] for key in _VARIANT_KEYS))
            )
        if found is not None:
            return found
        with self._write("cannot record the variant") as session:
            return get_or_create(session, VariantTable, values, _VARIANT_KEYS)

    @staticmethod
    def _variant_values(template: str, template_hash: str, params: Mapping[str, Any], name: str) -> dict[str, Any]:
        key = canonical_json(params)
        return {
            "template": text(template),
            "template_hash": text(template_hash),
            "params": json.loads(key),
            "params_key": key,
            "name": text(name),
        }

    def add_trial(self, rec: TrialRecord) -> int:
        """Store one trial (with its problem and variant) in one transaction; returns its id."""
        status = TrialStatus.parse(rec.status)
        variant_values = self._variant_values(rec.template, rec.template_hash, rec.params, rec.variant_name)
        with self._write("cannot store the trial") as session:
            trial = TrialTable(
                run_id=rec.run_id,
                problem_id=get_or_create(session, ProblemTable, rec.problem.to_dict(), q.PROBLEM_KEYS),
                variant_id=get_or_create(session, VariantTable, variant_values, _VARIANT_KEYS),
                study=text(rec.study),
                trial_number=rec.trial_number,
                status=status,
                timing=(timing := stored(rec.timing)),
                tflops=tflops(rec.problem, rec.tflops, timing.median_us if timing else None),
                rel_error=num(rec.rel_error),
                compile_s=num(rec.compile_s),
                registers=rec.registers,
                smem_bytes=rec.smem_bytes,
                spill_bytes=rec.spill_bytes,
                cubin_sha256=text(rec.cubin_sha256),
                error=text(rec.error),
                compile_log=text(rec.compile_log),
                source_path=text(rec.source_path),
                created_at=utcnow(),
            )
            self._require_run(session, rec.run_id)
            session.add(trial)
            session.flush()
            return trial.id

    def add_baseline(self, rec: BaselineRecord) -> int:
        with self._write("cannot store the baseline") as session:
            self._require_run(session, rec.run_id)
            baseline = BaselineTable(
                run_id=rec.run_id,
                problem_id=get_or_create(session, ProblemTable, rec.problem.to_dict(), q.PROBLEM_KEYS),
                impl=text(rec.impl),
                timing=stored(rec.timing),
                tflops=tflops(rec.problem, rec.tflops, rec.timing.median_us),
            )
            session.add(baseline)
            session.flush()
            return baseline.id

    def add_ncu_metrics(self, trial_id: int, metrics: list[NcuMetric]) -> None:
        """Insert or replace (by name) the ncu metrics of one trial."""
        with self._write("cannot store the ncu metrics") as session:
            if session.get(TrialTable, trial_id) is None:
                raise TunerError(f"no trial with id {trial_id}")
            for metric in metrics:
                values = {"trial_id": trial_id, "name": text(metric.name), "value": float(metric.value),
                          "unit": text(metric.unit)}  # fmt: skip
                stmt = upsert_insert(session, NcuMetricTable)
                if stmt is not None:
                    stmt = stmt.values(**values)
                    session.execute(
                        stmt.on_conflict_do_update(
                            index_elements=["trial_id", "name"],
                            set_={"value": stmt.excluded.value, "unit": stmt.excluded.unit},
                        )
                    )
                    continue
                existing = session.scalar(
                    select(NcuMetricTable).where(NcuMetricTable.trial_id == trial_id, NcuMetricTable.name == values["name"])
                )
                if existing is None:
                    session.add(NcuMetricTable(**values))
                else:
                    existing.value, existing.unit = values["value"], values["unit"]

    @staticmethod
    def _require_run(session: Session, run_id: int) -> None:
        if session.get(RunTable, run_id) is None:
            raise TunerError(f"no run with id {run_id}")

    # --- reads ------------------------------------------------------------------------------

    def find_trial(
        self, problem: Problem, template: str, template_hash: str, params: Mapping[str, Any], gpu_name: str,
        figure: Optional[str] = None, replayed_from: Optional[str] = None, study: Optional[str] = None,
    ) -> Optional[TrialRow]:
        """An earlier non-pruned measurement of this variant on this problem and GPU, if any (`figure`: a
        trials column an ok one must have, the figure a search minimizes), from measured runs, or with
        `replayed_from` from replays of that recording. A timeout or launch error is found only among
        the trials of `study` (its own outcome for the point; another study measures it again)."""
        stmt = q.find_select(problem, template, template_hash, canonical_json(params), gpu_name, figure, replayed_from,
                             study)
        with self._read("cannot query trials") as session:
            row = session.execute(stmt).first()
            return None if row is None else q.to_trial_row(row)

    def reusable_keys(
        self, problem: Problem, template: str, template_hash: str, gpu_name: str, figure: Optional[str] = None,
        replayed_from: Optional[str] = None, study: Optional[str] = None,
    ) -> set[str]:
        """The canonical parameters (params_key) of every variant find_trial would find now, in one query."""
        stmt = q.reusable_keys_select(problem, template, template_hash, gpu_name, figure, replayed_from, study)
        with self._read("cannot query trials") as session:
            return set(session.execute(stmt).scalars())

    def query_trials(self, filt: TrialFilter) -> list[TrialRow]:
        """Trials matching the filter, newest first."""
        with self._read("cannot query trials") as session:
            return [q.to_trial_row(row) for row in session.execute(q.query_select(filt))]

    def best_trials(self, filt: TrialFilter) -> list[TrialRow]:
        """The fastest ok trial per problem and GPU profile among those matching the filter."""
        if filt.status is not None and filt.status is not TrialStatus.OK:
            raise TunerError("best trials are ok trials; drop the status filter or use status ok")
        with self._read("cannot query trials") as session:
            return [q.to_trial_row(row) for row in session.execute(q.best_select(filt))]

    def variant_names(self, suffix: str, filt: TrialFilter) -> list[tuple[str, str]]:
        """(variant name, GPU profile) of the trials matching the filter whose variant name ends with `suffix`."""
        with self._read("cannot query trials") as session:
            return [(name, profile) for name, profile in session.execute(q.variant_names_select(suffix, filt))]

    def trial_detail(self, trial_id: int) -> TrialDetail:
        with self._read("cannot read the trial") as session:
            row = session.execute(q.trial_select(with_logs=True).where(TrialTable.id == trial_id)).first()
            if row is None:
                raise TunerError(f"no trial with id {trial_id}")
            trial, run = row[0], row[3]
            fields = q.to_trial_fields(row)
            metrics = [q.to_ncu_metric(m) for m in session.scalars(q.ncu_select(trial_id))]
            baselines = [
                q.to_baseline_row(b) for b in session.scalars(q.baselines_select(trial.run_id, trial.problem_id))
            ]
            return TrialDetail(
                **fields,
                compile_log=trial.compile_log,
                source_path=trial.source_path,
                run=RunInfo(**{f.name: getattr(run, f.name) for f in dataclass_fields(RunInfo)}),
                run_started_at=q.utc(run.started_at),
                run_ended_at=q.utc(run.ended_at),
                ncu_metrics=metrics,
                baselines=baselines,
            )

    # --- Optuna's journal (JSON lines, appended in order) -------------------------------------

    def append_journal(self, lines: list[str]) -> None:
        """Append log lines in one transaction: all of them or none."""
        self._journal.append(lines)

    def append_journal_if_empty(self, lines: list[str]) -> bool:
        """Append `lines` only to an empty journal, in one write transaction (an import races no one)."""
        return self._journal.append(lines, only_if_empty=True)

    def journal_lines(self, start: int = 0) -> list[str]:
        """The log lines from number `start` (0-based) on, in the order they were appended."""
        return [line for _, line in self._journal.rows(offset=start)]

    def journal_rows(self, *, after_id: Optional[int] = None, offset: int = 0) -> list[tuple[int, str]]:
        """(id, line) of the journal in append order: those after row `after_id` (a reader that has
        seen the journal up to there; SQLite numbers appended rows upwards in commit order), else
        from line number `offset` on."""
        return self._journal.rows(after_id=after_id, offset=offset)

    def baselines_for(self, run_id: int, problem_id: int) -> list[BaselineRow]:
        """Baselines of one run and problem, fastest first."""
        with self._read("cannot read baselines") as session:
            return [q.to_baseline_row(b) for b in session.scalars(q.baselines_select(run_id, problem_id))]


def _connect(url: Optional[str], create: bool = True) -> tuple[Engine, URL]:
    return eng.create_store_engine(url if url is not None else eng.default_db_url(), create)


def open_store(url: Optional[str] = None, *, create: bool = True) -> Store:
    """Open the store at `url` (default: default_db_url()).

    A new database is created at the newest schema; one at an older schema
    revision is refused with a hint to run `tuner db upgrade`.
    """
    engine, parsed = _connect(url, create)
    try:
        with eng.translate_errors(parsed, "cannot open the results store"):
            eng.check_schema(engine, parsed, create=create)
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, parsed)
