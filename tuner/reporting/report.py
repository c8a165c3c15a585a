"""The benchmark report: per problem the best tuned kernel beside the baselines of its run.

    files = write_report(db_url, gpu="h100", out_dir="benchmarks/")

Data comes from the results store only (plus the Optuna study for parameter
importance): a ratio compares numbers of one card and one run, so every
baseline shown is from the best trial's own run. Every figure and table says
which card and run produced it.
"""

from __future__ import annotations

import json
import os
import statistics
from datetime import datetime, timezone
from typing import Any, Optional

import optuna
from optuna.trial import TrialState

from tuner.backends.replay import is_synthetic_run
from tuner.errors import TunerError
from tuner.profiles import load_profile
from tuner.reporting import plots
from tuner.reporting.files import ensure_out_dir, os_error_text, safe_file_name
from tuner.reporting.report_markdown import render_markdown, report_json
from tuner.reporting.report_model import (
    BASELINE_ORDER,
    MIN_IMPORTANCE_TRIALS,
    TUNED,
    BenchmarkReport,
    ConfirmedVariant,
    ConfirmSection,
    ImplTiming,
    Importance,
    ProblemReport,
    ReportFiles,
    RunFacts,
    RunLabel,
    StudyCurve,
)  # fmt: skip
from tuner.runtime.energy import Energy, median_energy
from tuner.runtime.timing import per_round_ratio
from tuner.search.study import storage_for
from tuner.status import TrialStatus
from tuner.store import ConfirmedRow, Store, TrialFilter, TrialRow, default_db_url, open_store
from tuner.store.redact import redact_url


def _date(value: Optional[datetime]) -> str:
    return "unknown date" if value is None else value.astimezone(timezone.utc).date().isoformat()


def _ordered(impls: list[str]) -> list[str]:
    return [i for i in BASELINE_ORDER if i in impls] + sorted(set(impls) - set(BASELINE_ORDER))


def study_curves(rows: list[TrialRow], run_starts: dict[int, Optional[datetime]]) -> list[StudyCurve]:
    """Best-so-far curves of each study among `rows` (trials of one problem and card)."""
    curves = []
    for study in sorted({r.study for r in rows if r.study is not None}):
        mine = [r for r in rows if r.study == study]
        ok = [r for r in mine if r.status is TrialStatus.OK and r.median_us is not None]
        numbered = sorted((r for r in ok if r.trial_number is not None), key=lambda r: (r.trial_number, r.id))
        by_number: list[tuple[int, float]] = []
        for r in numbered:
            best = min(r.median_us, by_number[-1][1]) if by_number else r.median_us
            by_number.append((r.trial_number, best))
        starts = [run_starts.get(r.run_id) for r in mine]
        origin = min([s for s in starts if s is not None] or [min(r.created_at for r in mine)])
        by_time: list[tuple[float, float]] = []
        for r in sorted(ok, key=lambda r: (r.created_at, r.id)):
            best = min(r.median_us, by_time[-1][1]) if by_time else r.median_us
            by_time.append(((r.created_at - origin).total_seconds(), best))
        curves.append(StudyCurve(
            study=study, run_ids=tuple(sorted({r.run_id for r in mine})),
            trial_numbers=tuple(n for n, _ in by_number), best_by_number=tuple(b for _, b in by_number),
            elapsed_s=tuple(t for t, _ in by_time), best_by_time=tuple(b for _, b in by_time), trials=len(mine),
        ))  # fmt: skip
    return curves


def _optuna_storage(db_url: str) -> tuple[Optional[Any], str]:
    """The search's Optuna storage for this results store, or None and why (never creates one)."""
    try:
        return storage_for(db_url, create=False), ""
    except TunerError as exc:
        return None, str(exc)


def param_importance(storage: Optional[Any], study: str, why_none: str = "") -> Importance:
    """Optuna's parameter importances of one study, or a note saying why there are none."""
    if storage is None:
        return Importance(study, {}, note=why_none or "no Optuna storage")
    try:
        loaded = optuna.load_study(study_name=study, storage=storage)
    except KeyError:
        return Importance(study, {}, note=f"study {study!r} is not in the Optuna storage")
    complete = loaded.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return Importance(study, {}, note=f"too few complete trials for parameter importance "
                                          f"({len(complete)} < {MIN_IMPORTANCE_TRIALS})")
    try:
        import sklearn  # noqa: F401  (fANOVA needs it)

        evaluator: Any = optuna.importance.FanovaImportanceEvaluator(seed=0)
        name = "fANOVA"
    except ImportError:  # PED-ANOVA needs nothing beyond Optuna
        evaluator, name = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
    try:
        values = optuna.importance.get_param_importances(loaded, evaluator=evaluator)
    except (RuntimeError, ValueError) as exc:  # e.g. every complete trial has the same value
        return Importance(study, {}, evaluator=name, note=f"parameter importance failed: {exc}")
    return Importance(study, {k: float(v) for k, v in values.items()}, evaluator=name)


def gather_report(store: Store, gpu: str, *, db_url: str, run_id: Optional[int] = None) -> BenchmarkReport:
    """Everything the report shows, read from the store (and the Optuna storage next to it)."""
    best_rows = store.best_trials(TrialFilter(gpu=gpu, run_id=run_id))
    if not best_rows:
        if not store.query_trials(TrialFilter(gpu=gpu, limit=1)):
            # Neither a profile nor part of a stored card's name: the other commands' one-line error,
            # not "no ok trials" (which suggests a search that failed).
            load_profile(gpu)
        scope = f" in run {run_id}" if run_id is not None else ""
        raise TunerError(f"no ok trials for GPU {gpu!r}{scope} in {store.url}")
    storage, why_none = _optuna_storage(db_url)
    runs: dict[int, RunFacts] = {}
    try:
        problems = [_problem_report(store, best, gpu, run_id, runs, storage, why_none)
                    for best in sorted(best_rows, key=lambda r: (r.profile, r.problem))]
    finally:
        getattr(storage, "close", lambda: None)()
    return BenchmarkReport(gpu, redact_url(db_url), datetime.now(timezone.utc), tuple(problems), run_id,
                           tuple(runs[r] for r in sorted(runs)))


def _problem_report(store: Store, best: TrialRow, gpu: str, run_id: Optional[int], runs: dict[int, RunFacts],
                    storage: Optional[Any], why_none: str) -> ProblemReport:
    """One problem's section; adds the runs its studies span to `runs`."""
    detail = store.trial_detail(best.id)
    label = RunLabel(best.gpu_name, (best.run_id,), _date(detail.run_started_at), synthetic=is_synthetic_run(detail.run),
                     replayed_from=detail.run.replayed_from if detail.run is not None else None)
    baselines = {b.impl: b for b in detail.baselines}
    confirmed = _confirmed(store, best)
    energy = _confirm_energy(store, confirmed) if confirmed is not None and confirmed.run_id == best.run_id else {}
    assert best.timing is not None  # a best trial is an ok one
    timings = [ImplTiming(TUNED, best.timing, best.tflops, energy.get(best.variant_name))] + [
        ImplTiming(i, baselines[i].timing, baselines[i].tflops, energy.get(i)) for i in _ordered(list(baselines))
    ]
    rows = [r for r in store.query_trials(TrialFilter(gpu=gpu, problem=best.problem, run_id=run_id))
            if r.profile == best.profile]
    for rid in sorted({r.run_id for r in rows} - set(runs)):
        runs[rid] = _run_facts(store, next(r.id for r in rows if r.run_id == rid))
    curves = study_curves(rows, {rid: runs[rid].started_at for rid in runs})
    return ProblemReport(
        problem=best.problem, best=best, label=label, timings=tuple(timings), curves=tuple(curves),
        importances=tuple(param_importance(storage, c.study, why_none) for c in curves),
        ncu=tuple(detail.ncu_metrics), confirm=_confirm_section(store, best, rows, confirmed),
    )  # fmt: skip


def _confirmed(store: Store, best: TrialRow) -> Optional[ConfirmedRow]:
    """The newest confirm stage of the problem on this profile, where it re-timed the reported best (a stage of
    other trials, another run's or a replay's, is not this report's)."""
    confirmed = store.confirmed(best.problem, best.profile)
    if confirmed is None or best.id not in store.confirmed_trial_ids(confirmed.confirmation_id):
        return None
    return confirmed


def _confirm_energy(store: Store, confirmed: ConfirmedRow) -> dict[str, Energy]:
    """Each implementation's median Energy over the rounds of a confirm stage that read it."""
    found = {impl: median_energy(rounds) for impl, rounds in store.confirm_energy(confirmed.confirmation_id).items()}
    return {impl: e for impl, e in found.items() if e is not None}


def _confirm_section(store: Store, best: TrialRow, rows: list[TrialRow],
                     confirmed: Optional[ConfirmedRow]) -> Optional[ConfirmSection]:
    """The confirm stage that re-timed the reported best (_confirmed): each variant's in-search and confirmed µs."""
    if confirmed is None:
        return None
    timings = store.confirm_timings(confirmed.confirmation_id)
    energy = store.confirm_energy(confirmed.confirmation_id)
    in_search: dict[str, float] = {}  # each variant's fastest ok in-search time
    for r in rows:
        if r.status is TrialStatus.OK and r.median_us is not None:
            in_search[r.variant_name] = min(r.median_us, in_search.get(r.variant_name, r.median_us))
    base = timings.get(confirmed.baseline_impl or "")
    variants = tuple(ConfirmedVariant(
        name, in_search.get(name), statistics.median(times), per_round_ratio(base, times) if base else None,
        len(times), _median_joules(energy.get(name, [])),
    ) for name, times in timings.items() if name.startswith(best.template + "_"))
    return ConfirmSection(confirmed.run_id, confirmed.rounds, confirmed.baseline_impl, confirmed.variant_name,
                          tuple(sorted(variants, key=lambda v: -(v.ratio or 0))), confirmed.objective)


def _median_joules(energy: list[Optional[Energy]]) -> Optional[float]:
    joules = [e.joules_per_call for e in energy if e is not None]
    return statistics.median(joules) if joules else None


def _run_facts(store: Store, trial_id: int) -> RunFacts:
    d = store.trial_detail(trial_id)
    run = d.run
    if run is None:  # every trial has a run; keep the report going if a store says otherwise
        return RunFacts(d.run_id, d.gpu_name, d.run_started_at, None, None, None, None, None, None)
    return RunFacts(d.run_id, run.gpu_name, d.run_started_at, run.host, run.driver, run.cuda_version,
                    run.torch_version, run.tuner_version, run.command_line)


def write_report(db_url: Optional[str], gpu: str, out_dir: str, *, run_id: Optional[int] = None) -> ReportFiles:
    """Gather the report from the store at `db_url`, draw its figures, write report.md and report.json."""
    url = db_url or default_db_url()
    with open_store(url, create=False) as store:
        report = gather_report(store, gpu, db_url=url, run_id=run_id)
    ensure_out_dir(out_dir)
    try:
        return _write_files(report, out_dir)
    except OSError as exc:  # e.g. the disk filled up mid-way: one line, not a traceback
        raise TunerError(os_error_text(exc, out_dir)) from None


def _write_files(report: BenchmarkReport, out_dir: str) -> ReportFiles:
    figures: dict[str, str] = {}

    def draw(key: str, name: str, fn: Any, *args: Any) -> None:
        name = safe_file_name(name)  # p.key holds the profile name read from the store
        fn(*args, os.path.join(out_dir, name))
        figures[key] = name

    for p in report.problems:
        draw(f"{p.key}/compare", f"{p.key}-compare.png", plots.plot_comparison, p)
        if p.confirm is not None:
            draw(f"{p.key}/confirm", f"{p.key}-confirm.png", plots.plot_confirm, p)
        if any(c.best_by_number for c in p.curves):
            draw(f"{p.key}/convergence", f"{p.key}-convergence.png", plots.plot_convergence, p)
        for i, imp in enumerate(p.importances):
            if imp.values:
                draw(f"{p.key}/importance/{imp.study}", f"{p.key}-importance-{i + 1}.png",
                     plots.plot_importance, p, imp)
    md_path, json_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.json")
    with open(md_path, "w") as handle:
        handle.write(render_markdown(report, figures))
    with open(json_path, "w") as handle:
        json.dump(report_json(report), handle, indent=2)
    return ReportFiles(md_path, json_path, [os.path.join(out_dir, n) for n in figures.values()])
