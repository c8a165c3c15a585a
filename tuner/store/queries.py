"""SELECT statements of the store and the mapping of their rows to records."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import Select, and_, case, func, or_, select
from sqlalchemy.orm import defer

from tuner.problem import Problem
from tuner.profiles import profile_names
from tuner.runtime.energy import energy_of
from tuner.status import TrialStatus
from tuner.store.models import (
    BaselineTable,
    ConfirmationTable,
    NcuMetricTable,
    ProblemTable,
    RunTable,
    TrialTable,
    VariantTable,
)
from tuner.store.records import BaselineRow, ConfirmedRow, NcuMetric, TrialFilter, TrialRow

# The columns of a problem row: the fields of Problem.
PROBLEM_KEYS = tuple(Problem.__dataclass_fields__)


def to_problem(row: ProblemTable) -> Problem:
    return Problem.from_dict({f: getattr(row, f) for f in PROBLEM_KEYS} | {"causal": bool(row.causal)})


def utc(value: Optional[datetime]) -> Optional[datetime]:
    """SQLite gives naive datetimes back; everything is stored in UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def _best_baseline():
    """Per (run, problem): the fastest baseline's impl and median."""
    rank = (
        func.row_number()
        .over(partition_by=(BaselineTable.run_id, BaselineTable.problem_id), order_by=(BaselineTable.median_us, BaselineTable.id))
        .label("rank")
    )
    b = BaselineTable
    ranked = select(b.run_id, b.problem_id, b.impl, b.median_us, b.joules_per_call, b.power_w, b.sm_mhz,
                    rank).subquery()
    return (
        select(ranked.c.run_id, ranked.c.problem_id, ranked.c.impl, ranked.c.median_us, ranked.c.joules_per_call,
               ranked.c.power_w, ranked.c.sm_mhz)
        .where(ranked.c.rank == 1)
        .subquery("best_baseline")
    )


def trial_select(*, with_logs: bool = False) -> Select:
    """Trials joined with problem, variant, run and their best baseline."""
    best = _best_baseline()
    stmt = (
        select(TrialTable, ProblemTable, VariantTable, RunTable, best.c.impl, best.c.median_us,
               best.c.joules_per_call, best.c.power_w, best.c.sm_mhz)
        .join(ProblemTable, TrialTable.problem_id == ProblemTable.id)
        .join(VariantTable, TrialTable.variant_id == VariantTable.id)
        .join(RunTable, TrialTable.run_id == RunTable.id)
        .outerjoin(best, and_(best.c.run_id == TrialTable.run_id, best.c.problem_id == TrialTable.problem_id))
    )
    if not with_logs:
        stmt = stmt.options(defer(TrialTable.compile_log), defer(TrialTable.source_path), defer(RunTable.command_line))
    return stmt


def apply_filter(stmt: Select, filt: TrialFilter) -> Select:
    """WHERE clauses of a TrialFilter; the statement must join runs, problems and variants."""
    if filt.gpu:
        gpu = filt.gpu.strip()
        if gpu.lower() in profile_names():
            # A profile name is exact: "l4" must not match "NVIDIA L40S", nor "a10" an A100.
            stmt = stmt.where(RunTable.profile == gpu.lower())
        else:
            stmt = stmt.where(func.lower(RunTable.gpu_name).contains(gpu.lower(), autoescape=True))
    if filt.shape is not None:
        b, h, sq, sk, d = filt.shape
        stmt = stmt.where(
            ProblemTable.batch == b,
            ProblemTable.heads == h,
            ProblemTable.seq_q == sq,
            ProblemTable.seq_k == sk,
            ProblemTable.head_dim == d,
        )
    if filt.problem is not None:
        stmt = stmt.where(*(getattr(ProblemTable, key) == value for key, value in filt.problem.to_dict().items()))
    if filt.dtype:
        stmt = stmt.where(ProblemTable.dtype == filt.dtype)
    if filt.causal is not None:
        stmt = stmt.where(ProblemTable.causal == filt.causal)
    if filt.kernel_pass is not None:
        stmt = stmt.where(ProblemTable.kernel_pass == filt.kernel_pass)
    if filt.template:
        stmt = stmt.where(VariantTable.template == filt.template)
    if filt.template_hashes is not None:
        stmt = stmt.where(VariantTable.template_hash.in_(filt.template_hashes))
    if filt.status is not None:
        stmt = stmt.where(TrialTable.status == filt.status)
    if filt.run_id is not None:
        stmt = stmt.where(TrialTable.run_id == filt.run_id)
    if filt.study is not None:
        stmt = stmt.where(TrialTable.study == filt.study)
    if filt.trial_number is not None:
        stmt = stmt.where(TrialTable.trial_number == filt.trial_number)
    return stmt


def query_select(filt: TrialFilter) -> Select:
    """Matching trials, newest first."""
    stmt = apply_filter(trial_select(), filt).order_by(TrialTable.id.desc())
    return stmt.limit(filt.limit) if filt.limit else stmt


def best_select(filt: TrialFilter) -> Select:
    """The fastest ok trial per (problem, GPU profile) among the matching ones."""
    rank = (
        func.row_number()
        .over(partition_by=(TrialTable.problem_id, RunTable.profile), order_by=(TrialTable.median_us, TrialTable.id))
        .label("rank")
    )
    candidates = (
        select(TrialTable.id.label("trial_id"), rank)
        .join(ProblemTable, TrialTable.problem_id == ProblemTable.id)
        .join(VariantTable, TrialTable.variant_id == VariantTable.id)
        .join(RunTable, TrialTable.run_id == RunTable.id)
        .where(TrialTable.status == TrialStatus.OK, TrialTable.median_us.is_not(None))
    )
    ranked = apply_filter(candidates, filt).subquery("ranked")
    stmt = (
        trial_select()
        .join(ranked, ranked.c.trial_id == TrialTable.id)
        .where(ranked.c.rank == 1)
        .order_by(
            ProblemTable.dtype,
            ProblemTable.head_dim,
            ProblemTable.batch,
            ProblemTable.heads,
            ProblemTable.seq_q,
            ProblemTable.seq_k,
            ProblemTable.causal,
            ProblemTable.layout,
            ProblemTable.lengths,
            RunTable.profile,
        )
    )
    return stmt.limit(filt.limit) if filt.limit else stmt


def variant_names_select(suffix: str, filt: TrialFilter) -> Select:
    """(variant name, GPU profile) of the matching trials whose variant name ends with `suffix`, once each."""
    stmt = (
        select(VariantTable.name, RunTable.profile)
        .select_from(TrialTable)
        .join(ProblemTable, TrialTable.problem_id == ProblemTable.id)
        .join(VariantTable, TrialTable.variant_id == VariantTable.id)
        .join(RunTable, TrialTable.run_id == RunTable.id)
        .where(VariantTable.name.endswith(suffix, autoescape=True))  # escaped: `_` is a LIKE wildcard
    )
    return apply_filter(stmt, filt).distinct().order_by(VariantTable.name, RunTable.profile)


def find_select(problem: Problem, template: str, template_hash: str, params_key: str, gpu_name: str,
                figure: Optional[str] = None, replayed_from: Optional[str] = None,
                study: Optional[str] = None) -> Select:
    """A reusable measurement: same problem, variant and GPU, from the same source; ok ones first, then newest.

    Deterministic outcomes (ok, incorrect, compile_error) are reused from any run. A timeout or launch
    error may be transient (a busy card, a stuck worker): another study measures it again, but within
    `study` it is that study's outcome for the point, answered like any other (--trials N: N distinct).
    `figure` (a trials column, e.g. joules_per_call): an ok trial is reused only when it has it.
    `replayed_from`: a replay's recording, whose runs alone it reuses; None (a measuring search) reuses
    measured runs alone (a replay reports the recording's card: its answers are not that card's measurements).
    """
    stmt = trial_select().where(VariantTable.params_key == params_key,
                                *_reusable(problem, template, template_hash, gpu_name, figure, replayed_from, study))
    ok_first = case((TrialTable.status == TrialStatus.OK, 0), else_=1)
    return stmt.order_by(ok_first, TrialTable.id.desc()).limit(1)


def reusable_keys_select(problem: Problem, template: str, template_hash: str, gpu_name: str,
                         figure: Optional[str] = None, replayed_from: Optional[str] = None,
                         study: Optional[str] = None) -> Select:
    """The params_key of every variant find_select would find a measurement of (the same conditions)."""
    return (select(VariantTable.params_key).select_from(TrialTable)
            .join(ProblemTable, TrialTable.problem_id == ProblemTable.id)
            .join(VariantTable, TrialTable.variant_id == VariantTable.id)
            .join(RunTable, TrialTable.run_id == RunTable.id)
            .where(*_reusable(problem, template, template_hash, gpu_name, figure, replayed_from, study)).distinct())


def _reusable(problem: Problem, template: str, template_hash: str, gpu_name: str, figure: Optional[str],
              replayed_from: Optional[str], study: Optional[str]) -> list[Any]:
    """find_select's conditions but the variant's parameters."""
    source = RunTable.replayed_from.is_(None) if replayed_from is None else RunTable.replayed_from == replayed_from
    reusable = TrialTable.status.in_([TrialStatus.OK, TrialStatus.INCORRECT, TrialStatus.COMPILE_ERROR])
    if study is not None:
        reusable = or_(reusable, and_(TrialTable.study == study,
                                      TrialTable.status.in_([TrialStatus.LAUNCH_ERROR, TrialStatus.TIMEOUT])))
    conditions = [VariantTable.template == template, VariantTable.template_hash == template_hash,
                  RunTable.gpu_name == gpu_name, source, reusable,
                  *(getattr(ProblemTable, key) == value for key, value in problem.to_dict().items())]
    if figure is not None:
        conditions.append(or_(TrialTable.status != TrialStatus.OK, getattr(TrialTable, figure).is_not(None)))
    return conditions


def baselines_select(run_id: int, problem_id: int) -> Select:
    return (
        select(BaselineTable)
        .where(BaselineTable.run_id == run_id, BaselineTable.problem_id == problem_id)
        .order_by(BaselineTable.median_us, BaselineTable.id)
    )


def ncu_select(trial_id: int) -> Select:
    return select(NcuMetricTable).where(NcuMetricTable.trial_id == trial_id).order_by(NcuMetricTable.name)


def to_trial_fields(row: Any) -> dict[str, Any]:
    """Keyword arguments of TrialRow from one row of trial_select()."""
    trial, problem, variant, run, best_impl, best_us, best_joules, best_watts, best_mhz = row
    ratio = None
    timing = trial.timing
    if best_us is not None and timing is not None and timing.median_us:
        ratio = best_us / timing.median_us
    return dict(
        id=trial.id,
        run_id=trial.run_id,
        problem_id=trial.problem_id,
        variant_id=trial.variant_id,
        problem=to_problem(problem),
        template=variant.template,
        template_hash=variant.template_hash,
        variant_name=variant.name,
        params=dict(variant.params),
        study=trial.study,
        trial_number=trial.trial_number,
        status=TrialStatus(trial.status),
        timing=timing,
        tflops=trial.tflops,
        rel_error=trial.rel_error,
        compile_s=trial.compile_s,
        registers=trial.registers,
        smem_bytes=trial.smem_bytes,
        spill_bytes=trial.spill_bytes,
        cubin_sha256=trial.cubin_sha256,
        error=trial.error,
        gpu_name=run.gpu_name,
        profile=run.profile,
        created_at=utc(trial.created_at),
        best_baseline_impl=best_impl,
        best_baseline_us=best_us,
        ratio_to_best_baseline=ratio,
        best_baseline_energy=energy_of(best_joules, best_watts, best_mhz),
        replayed_from=run.replayed_from,
    )


def to_trial_row(row: Any) -> TrialRow:
    return TrialRow(**to_trial_fields(row))


def to_baseline_row(row: BaselineTable) -> BaselineRow:
    return BaselineRow(
        id=row.id,
        run_id=row.run_id,
        problem_id=row.problem_id,
        impl=row.impl,
        timing=row.timing,
        tflops=row.tflops,
    )


def to_ncu_metric(row: NcuMetricTable) -> NcuMetric:
    return NcuMetric(name=row.name, value=row.value, unit=row.unit)


def confirmed_select(problem: Problem, gpu: Optional[str], objective: Optional[str] = None) -> Select:
    """The newest confirmation of `problem` (optionally on one GPU profile, of one objective), with its
    winner's name."""
    stmt = (select(ConfirmationTable, VariantTable.name, RunTable.profile)
            .join(ProblemTable, ProblemTable.id == ConfirmationTable.problem_id)
            .join(TrialTable, TrialTable.id == ConfirmationTable.winner_trial_id)
            .join(VariantTable, VariantTable.id == TrialTable.variant_id)
            .join(RunTable, RunTable.id == ConfirmationTable.run_id)
            .where(*(getattr(ProblemTable, key) == value for key, value in problem.to_dict().items())))
    if gpu:
        stmt = stmt.where(RunTable.profile == gpu.strip().lower())
    if objective is not None:  # NULL: time, as stored before revision 0007
        stmt = stmt.where(ConfirmationTable.objective.is_(None) if objective == "time"
                          else ConfirmationTable.objective == objective)
    return stmt.order_by(ConfirmationTable.id.desc()).limit(1)


def to_confirmed_row(found: Any, problem: Problem) -> ConfirmedRow:
    row, name, _profile = found
    return ConfirmedRow(confirmation_id=row.id, run_id=row.run_id, problem=problem, trial_id=row.winner_trial_id,
                        variant_name=name, median_us=row.winner_us, ratio=row.winner_ratio,
                        baseline_impl=row.baseline_impl, rounds=row.rounds, objective=row.objective or "time",
                        joules_per_call=row.winner_joules_per_call)

