"""SELECT statements of the store and the mapping of their rows to records."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import Select, and_, case, func, select
from sqlalchemy.orm import defer

from tuner.problem import Problem
from tuner.store.models import Baseline, NcuMetricRow, ProblemRow, Run, Trial, Variant
from tuner.store.records import BaselineRow, NcuMetric, TrialFilter, TrialRow, TrialStatus


def problem_values(problem: Problem) -> dict[str, Any]:
    return {
        "batch": problem.batch,
        "heads": problem.heads,
        "heads_kv": problem.heads_kv,
        "seq_q": problem.seq_q,
        "seq_k": problem.seq_k,
        "head_dim": problem.head_dim,
        "dtype": problem.dtype,
        "causal": bool(problem.causal),
        "layout": problem.layout,
    }


def to_problem(row: ProblemRow) -> Problem:
    return Problem(
        batch=row.batch,
        heads=row.heads,
        seq_q=row.seq_q,
        seq_k=row.seq_k,
        head_dim=row.head_dim,
        dtype=row.dtype,
        causal=bool(row.causal),
        heads_kv=row.heads_kv,
        layout=row.layout,
    )


def utc(value: Optional[datetime]) -> Optional[datetime]:
    """SQLite gives naive datetimes back; everything is stored in UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def _best_baseline():
    """Per (run, problem): the fastest baseline's impl and median."""
    rank = (
        func.row_number()
        .over(partition_by=(Baseline.run_id, Baseline.problem_id), order_by=(Baseline.median_us, Baseline.id))
        .label("rank")
    )
    ranked = select(Baseline.run_id, Baseline.problem_id, Baseline.impl, Baseline.median_us, rank).subquery()
    return (
        select(ranked.c.run_id, ranked.c.problem_id, ranked.c.impl, ranked.c.median_us)
        .where(ranked.c.rank == 1)
        .subquery("best_baseline")
    )


def trial_select(*, with_logs: bool = False) -> Select:
    """Trials joined with problem, variant, run and their best baseline."""
    best = _best_baseline()
    stmt = (
        select(Trial, ProblemRow, Variant, Run, best.c.impl, best.c.median_us)
        .join(ProblemRow, Trial.problem_id == ProblemRow.id)
        .join(Variant, Trial.variant_id == Variant.id)
        .join(Run, Trial.run_id == Run.id)
        .outerjoin(best, and_(best.c.run_id == Trial.run_id, best.c.problem_id == Trial.problem_id))
    )
    if not with_logs:
        stmt = stmt.options(defer(Trial.compile_log), defer(Trial.source_path), defer(Run.command_line))
    return stmt


def apply_filter(stmt: Select, filt: TrialFilter) -> Select:
    """WHERE clauses of a TrialFilter; the statement must join runs, problems and variants."""
    if filt.gpu:
        gpu = filt.gpu.strip()
        from tuner.profiles import profile_names

        if gpu.lower() in profile_names():
            # A profile name is exact: "l4" must not match "NVIDIA L40S", nor "a10" an A100.
            stmt = stmt.where(Run.profile == gpu.lower())
        else:
            stmt = stmt.where(func.lower(Run.gpu_name).contains(gpu.lower(), autoescape=True))
    if filt.shape is not None:
        b, h, sq, sk, d = filt.shape
        stmt = stmt.where(
            ProblemRow.batch == b,
            ProblemRow.heads == h,
            ProblemRow.seq_q == sq,
            ProblemRow.seq_k == sk,
            ProblemRow.head_dim == d,
        )
    if filt.dtype:
        stmt = stmt.where(ProblemRow.dtype == filt.dtype)
    if filt.causal is not None:
        stmt = stmt.where(ProblemRow.causal == filt.causal)
    if filt.template:
        stmt = stmt.where(Variant.template == filt.template)
    if filt.status is not None:
        stmt = stmt.where(Trial.status == filt.status)
    if filt.run_id is not None:
        stmt = stmt.where(Trial.run_id == filt.run_id)
    if filt.study is not None:
        stmt = stmt.where(Trial.study == filt.study)
    return stmt


def query_select(filt: TrialFilter) -> Select:
    """Matching trials, newest first."""
    stmt = apply_filter(trial_select(), filt).order_by(Trial.id.desc())
    return stmt.limit(filt.limit) if filt.limit else stmt


def best_select(filt: TrialFilter) -> Select:
    """The fastest ok trial per (problem, GPU profile) among the matching ones."""
    rank = (
        func.row_number()
        .over(partition_by=(Trial.problem_id, Run.profile), order_by=(Trial.median_us, Trial.id))
        .label("rank")
    )
    candidates = (
        select(Trial.id.label("trial_id"), rank)
        .join(ProblemRow, Trial.problem_id == ProblemRow.id)
        .join(Variant, Trial.variant_id == Variant.id)
        .join(Run, Trial.run_id == Run.id)
        .where(Trial.status == TrialStatus.OK, Trial.median_us.is_not(None))
    )
    ranked = apply_filter(candidates, filt).subquery("ranked")
    stmt = (
        trial_select()
        .join(ranked, ranked.c.trial_id == Trial.id)
        .where(ranked.c.rank == 1)
        .order_by(
            ProblemRow.dtype,
            ProblemRow.head_dim,
            ProblemRow.batch,
            ProblemRow.heads,
            ProblemRow.seq_q,
            ProblemRow.seq_k,
            ProblemRow.causal,
            ProblemRow.layout,
            Run.profile,
        )
    )
    return stmt.limit(filt.limit) if filt.limit else stmt


def find_select(problem: Problem, template: str, template_hash: str, params_key: str, gpu_name: str) -> Select:
    """A reusable measurement: same problem, variant and GPU; ok ones first, then newest.

    Only deterministic outcomes are reused (ok, incorrect, compile_error): a timeout or
    launch error may be transient (a busy card, a stuck worker) and is measured again.
    """
    stmt = trial_select().where(
        Variant.template == template,
        Variant.template_hash == template_hash,
        Variant.params_key == params_key,
        Run.gpu_name == gpu_name,
        Trial.status.in_([TrialStatus.OK, TrialStatus.INCORRECT, TrialStatus.COMPILE_ERROR]),
        *(getattr(ProblemRow, key) == value for key, value in problem_values(problem).items()),
    )
    ok_first = case((Trial.status == TrialStatus.OK, 0), else_=1)
    return stmt.order_by(ok_first, Trial.id.desc()).limit(1)


def baselines_select(run_id: int, problem_id: int) -> Select:
    return (
        select(Baseline)
        .where(Baseline.run_id == run_id, Baseline.problem_id == problem_id)
        .order_by(Baseline.median_us, Baseline.id)
    )


def ncu_select(trial_id: int) -> Select:
    return select(NcuMetricRow).where(NcuMetricRow.trial_id == trial_id).order_by(NcuMetricRow.name)


def to_trial_fields(row: Any) -> dict[str, Any]:
    """Keyword arguments of TrialRow from one row of trial_select()."""
    trial, problem, variant, run, best_impl, best_us = row
    ratio = None
    if best_us is not None and trial.median_us:
        ratio = best_us / trial.median_us
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
        median_us=trial.median_us,
        p20_us=trial.p20_us,
        p80_us=trial.p80_us,
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
    )


def to_trial_row(row: Any) -> TrialRow:
    return TrialRow(**to_trial_fields(row))


def to_baseline_row(row: Baseline) -> BaselineRow:
    return BaselineRow(
        id=row.id,
        run_id=row.run_id,
        problem_id=row.problem_id,
        impl=row.impl,
        median_us=row.median_us,
        p20_us=row.p20_us,
        p80_us=row.p80_us,
        tflops=row.tflops,
    )


def to_ncu_metric(row: NcuMetricRow) -> NcuMetric:
    return NcuMetric(name=row.name, value=row.value, unit=row.unit)
