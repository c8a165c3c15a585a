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
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Optional

from tuner.errors import TunerError
from tuner.reporting.markdown import fmt as _f
from tuner.reporting.markdown import run_caption
from tuner.reporting.markdown import table as _table
from tuner.problem import Problem
from tuner.backends.replay import is_synthetic_run
from tuner.search.samplers import problem_key
from tuner.store import NcuMetric, Store, TrialFilter, TrialRow, TrialStatus, default_db_url, open_store, redact_url

# Shown first, in this order; other baselines follow alphabetically.
BASELINE_ORDER = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "triton_fa2")
TUNED = "tuned"
MIN_IMPORTANCE_TRIALS = 10  # fewer complete trials give importances that are noise


@dataclass(frozen=True)
class RunLabel:
    """Which card and run produced a number."""

    gpu_name: str
    run_ids: tuple[int, ...]
    date: str  # UTC date the run started
    synthetic: bool = False

    @property
    def caption(self) -> str:
        return run_caption(self.gpu_name, self.run_ids, self.date, self.synthetic)


@dataclass(frozen=True)
class RunFacts:
    """One row of the report's run table: where and with what a run measured."""

    run_id: int
    gpu_name: str
    started_at: Optional[datetime]
    host: Optional[str]
    driver: Optional[str]
    cuda_version: Optional[str]
    torch_version: Optional[str]
    tuner_version: Optional[str]
    command_line: Optional[str]


@dataclass(frozen=True)
class Timing:
    impl: str  # TUNED or a baseline name
    median_us: float
    tflops: Optional[float]


@dataclass(frozen=True)
class StudyCurve:
    """Best-so-far µs of one study, by trial number and by seconds since its run started."""

    study: str
    run_ids: tuple[int, ...]
    trial_numbers: tuple[int, ...]
    best_by_number: tuple[float, ...]
    elapsed_s: tuple[float, ...]
    best_by_time: tuple[float, ...]
    trials: int  # stored trials of the study (any status)


@dataclass(frozen=True)
class Importance:
    study: str
    values: dict[str, float]  # empty when unavailable (see note)
    evaluator: str = ""
    note: str = ""


@dataclass(frozen=True)
class ProblemReport:
    problem: Problem
    best: TrialRow
    label: RunLabel
    timings: tuple[Timing, ...]  # tuned first, then the run's baselines
    curves: tuple[StudyCurve, ...] = ()
    importances: tuple[Importance, ...] = ()
    ncu: tuple[NcuMetric, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.best.profile}-{problem_key(self.problem)}"

    @property
    def curves_label(self) -> RunLabel:
        """The label with the runs of this problem's studies (they may span several runs)."""
        return replace(self.label, run_ids=tuple(sorted({r for c in self.curves for r in c.run_ids})))

    @property
    def ratios(self) -> dict[str, float]:
        """Baseline µs / tuned µs per baseline: > 1 means the tuned kernel is faster."""
        tuned = self.best.median_us
        return {t.impl: t.median_us / tuned for t in self.timings if t.impl != TUNED and tuned}


@dataclass(frozen=True)
class BenchmarkReport:
    gpu: str
    db_url: str  # password hidden
    generated_at: datetime
    problems: tuple[ProblemReport, ...]
    run_id: Optional[int] = None
    runs: tuple[RunFacts, ...] = ()

    @property
    def baseline_impls(self) -> list[str]:
        found = {t.impl for p in self.problems for t in p.timings if t.impl != TUNED}
        return [i for i in BASELINE_ORDER if i in found] + sorted(found - set(BASELINE_ORDER))

    @property
    def gpu_names(self) -> list[str]:
        return sorted({p.label.gpu_name for p in self.problems})

    @property
    def synthetic(self) -> bool:
        return any(p.label.synthetic for p in self.problems)


@dataclass(frozen=True)
class ReportFiles:
    markdown: str
    json: str
    figures: list[str] = field(default_factory=list)


# --- gathering ----------------------------------------------------------------------------------


def _date(value: Optional[datetime]) -> str:
    return "unknown date" if value is None else value.astimezone(timezone.utc).date().isoformat()


def _ordered(impls: list[str]) -> list[str]:
    return [i for i in BASELINE_ORDER if i in impls] + sorted(set(impls) - set(BASELINE_ORDER))


def _same_problem_filter(problem: Problem, gpu: str, run_id: Optional[int] = None) -> TrialFilter:
    p = problem
    return TrialFilter(gpu=gpu, shape=(p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim), dtype=p.dtype,
                       causal=p.causal, run_id=run_id)


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
    from tuner.search.study import JOURNAL_SUFFIX, storage_for
    from tuner.store.engine import parse_url, sqlite_file

    parsed = parse_url(db_url)
    if parsed.get_backend_name() == "sqlite":
        database = sqlite_file(parsed)
        if database is None:
            return None, "an in-memory results store has no Optuna storage"
        if not os.path.exists(database + JOURNAL_SUFFIX):
            return None, f"no Optuna storage ({os.path.basename(database)}{JOURNAL_SUFFIX}) next to the results store"
    try:
        return storage_for(db_url), ""
    except TunerError as exc:
        return None, str(exc)


def param_importance(storage: Optional[Any], study: str, why_none: str = "") -> Importance:
    """Optuna's parameter importances of one study, or a note saying why there are none."""
    import optuna
    from optuna.trial import TrialState

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
        scope = f" in run {run_id}" if run_id is not None else ""
        raise TunerError(f"no ok trials for GPU {gpu!r}{scope} in {store.url}")
    storage, why_none = _optuna_storage(db_url)
    problems = []
    runs: dict[int, RunFacts] = {}
    for best in sorted(best_rows, key=lambda r: (r.profile, r.problem)):
        detail = store.trial_detail(best.id)
        label = RunLabel(best.gpu_name, (best.run_id,), _date(detail.run_started_at),
                         synthetic=is_synthetic_run(detail.run))
        baselines = {b.impl: b for b in detail.baselines}
        timings = [Timing(TUNED, float(best.median_us), best.tflops)] + [
            Timing(i, baselines[i].median_us, baselines[i].tflops) for i in _ordered(list(baselines))
        ]
        rows = [r for r in store.query_trials(_same_problem_filter(best.problem, gpu, run_id))
                if r.problem == best.problem and r.profile == best.profile]
        for rid in sorted({r.run_id for r in rows} - set(runs)):
            runs[rid] = _run_facts(store, next(r.id for r in rows if r.run_id == rid))
        curves = study_curves(rows, {rid: runs[rid].started_at for rid in runs})
        problems.append(ProblemReport(
            problem=best.problem, best=best, label=label, timings=tuple(timings), curves=tuple(curves),
            importances=tuple(param_importance(storage, c.study, why_none) for c in curves),
            ncu=tuple(detail.ncu_metrics),
        ))  # fmt: skip
    return BenchmarkReport(gpu, redact_url(db_url), datetime.now(timezone.utc), tuple(problems), run_id,
                           tuple(runs[r] for r in sorted(runs)))


def _run_facts(store: Store, trial_id: int) -> RunFacts:
    d = store.trial_detail(trial_id)
    run = d.run
    if run is None:  # every trial has a run; keep the report going if a store says otherwise
        return RunFacts(d.run_id, d.gpu_name, d.run_started_at, None, None, None, None, None, None)
    return RunFacts(d.run_id, run.gpu_name, d.run_started_at, run.host, run.driver, run.cuda_version,
                    run.torch_version, run.tuner_version, run.command_line)


# --- markdown -----------------------------------------------------------------------------------


def _figure(lines: list[str], figures: dict[str, str], key: str, number: list[int], caption: str) -> None:
    """Append the figure `key` (if drawn) with a numbered caption naming card and run."""
    if key in figures:
        number[0] += 1
        lines += [f"![{caption}]({figures[key]})", "", f"*Figure {number[0]}: {caption}*", ""]


def render_markdown(report: BenchmarkReport, figures: Optional[dict[str, str]] = None) -> str:
    """report.md; `figures` maps figure keys (see write_report) to file names relative to it."""
    import tuner

    figures = figures or {}
    number = [0]
    lines = [f"# Benchmark report: {', '.join(report.gpu_names)} (--gpu {report.gpu})", ""]
    if report.synthetic:
        lines += ["> **SYNTHETIC data**: some runs below come from a synthetic recording (made-up timings, "
                  "host \"synthetic\"), not from a GPU.", ""]
    scope = f", run {report.run_id} only" if report.run_id is not None else ""
    lines += [f"Results store {report.db_url}{scope}; generated {report.generated_at:%Y-%m-%d %H:%M} UTC by "
              f"tuner {tuner.__version__}. Each row compares numbers of one card and one run, named in the row; "
              "speed-up = baseline µs / tuned µs (> 1: the tuned kernel is faster).", ""]
    lines += ["## Summary", ""]
    rows = []
    for p in report.problems:
        # baseline, its µs and the speed-up all from the store's one choice (a second pick could differ on ties)
        rows.append([p.problem.label, p.label.gpu_name, str(p.best.run_id), p.label.date, p.best.variant_name,
                     _f(p.best.median_us, ".3f"), _f(p.best.tflops, ".1f"), p.best.best_baseline_impl or "-",
                     _f(p.best.best_baseline_us, ".3f"), _f(p.best.ratio_to_best_baseline, ".3f", "x")])
    lines += _table(["problem", "card", "run", "date", "best variant", "µs", "TFLOP/s", "best baseline",
                     "baseline µs", "speed-up"], rows, right_from=5)
    impls = report.baseline_impls
    lines += ["## Speed-up over each baseline", ""]
    rows = [[p.problem.label, p.label.caption] + [_f(p.ratios.get(i), ".3f", "x") for i in impls]
            for p in report.problems]
    lines += _table(["problem", "card, run, date"] + impls, rows, right_from=2)
    lines += ["## Runs", ""]
    rows = [[str(r.run_id), r.gpu_name, f"{r.started_at:%Y-%m-%d %H:%M} UTC" if r.started_at else "-",
             r.host or "-", r.driver or "-", r.cuda_version or "-", r.torch_version or "-", r.tuner_version or "-",
             f"`{r.command_line}`" if r.command_line else "-"] for r in report.runs]
    lines += _table(["run", "card", "started", "host", "driver", "CUDA", "torch", "tuner", "command line"], rows,
                    right_from=99)
    for p in report.problems:
        lines += _problem_section(p, figures, number)
    return "\n".join(lines)


def _problem_section(p: ProblemReport, figures: dict[str, str], number: list[int]) -> list[str]:
    cap = p.label.caption
    lines = [f"## {p.problem.label} ({p.best.profile})", "",
             f"Best: trial {p.best.id}, `{p.best.variant_name}` ({p.best.template}), {cap}.", ""]
    _figure(lines, figures, f"{p.key}/compare", number,
            f"{p.problem.label}: tuned kernel and baselines of the same run — {cap}.")
    rows = [[f"tuned `{p.best.variant_name}`" if t.impl == TUNED else t.impl, _f(t.median_us, ".3f"),
             _f(t.tflops, ".1f"), "1.000x" if t.impl == TUNED else _f(p.ratios.get(t.impl), ".3f", "x")]
            for t in p.timings]
    lines += _table(["implementation", "µs", "TFLOP/s", "speed-up of tuned"], rows)
    if len(p.timings) == 1:
        lines += [f"No baselines were recorded in run {p.best.run_id}.", ""]
    lines += ["### Search progress", ""]
    if not p.curves:
        lines += ["No study recorded trials of this problem (trials without an Optuna study number).", ""]
    else:
        _figure(lines, figures, f"{p.key}/convergence", number,
                f"{p.problem.label}: best-so-far µs by trial number and wall time, per study — "
                f"{p.curves_label.caption}.")
        rows = [[f"`{c.study}`", ", ".join(map(str, c.run_ids)), str(c.trials), str(len(c.trial_numbers)),
                 _f(c.best_by_number[0] if c.best_by_number else None, ".3f"),
                 _f(c.best_by_number[-1] if c.best_by_number else None, ".3f"),
                 _f(c.elapsed_s[-1] if c.elapsed_s else None, ".1f")] for c in p.curves]
        lines += _table(["study", "runs", "stored trials", "ok trials", "first ok µs", "best µs",
                         "last ok at (s)"], rows, right_from=2)
    lines += ["### Parameter importance", ""]
    for imp in p.importances:
        if not imp.values:
            lines += [f"`{imp.study}`: {imp.note}.", ""]
            continue
        _figure(lines, figures, f"{p.key}/importance/{imp.study}", number,
                f"{p.problem.label}: parameter importance ({imp.evaluator}) of study {imp.study} — {cap}.")
        lines += [f"`{imp.study}` ({imp.evaluator}, Optuna):", ""]
        lines += _table(["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in imp.values.items()])
    if not p.importances:
        lines += ["No study to evaluate.", ""]
    lines += [f"### ncu metrics of the winner (trial {p.best.id})", ""]
    if p.ncu:
        lines += _table(["metric", "value", "unit"], [[m.name, f"{m.value:,.6g}", m.unit or ""] for m in p.ncu],
                        right_from=1)
    else:
        lines += [f"Not profiled: run `tuner profile {p.best.id}` on a {p.label.gpu_name}.", ""]
    return lines


def report_json(report: BenchmarkReport) -> dict[str, Any]:
    """The report's numbers at full precision (for scripts and tests)."""
    return {
        "gpu": report.gpu, "db_url": report.db_url, "generated_at": report.generated_at.isoformat(),
        "run_id": report.run_id,
        "runs": [{"run_id": r.run_id, "gpu_name": r.gpu_name, "host": r.host, "command_line": r.command_line,
                  "started_at": r.started_at.isoformat() if r.started_at else None} for r in report.runs],
        "problems": [{
            "problem": p.problem.label, "profile": p.best.profile, "gpu_name": p.label.gpu_name,
            "run_id": p.best.run_id, "date": p.label.date, "synthetic": p.label.synthetic,
            "best_trial_id": p.best.id, "best_variant": p.best.variant_name, "best_us": p.best.median_us,
            "best_tflops": p.best.tflops, "best_baseline_impl": p.best.best_baseline_impl,
            "ratio_to_best_baseline": p.best.ratio_to_best_baseline,
            "timings": [{"impl": t.impl, "median_us": t.median_us, "tflops": t.tflops} for t in p.timings],
            "ratios": p.ratios,
            "studies": [{"study": c.study, "run_ids": list(c.run_ids), "trials": c.trials,
                         "best_us": c.best_by_number[-1] if c.best_by_number else None} for c in p.curves],
            "importance": [{"study": i.study, "evaluator": i.evaluator, "values": i.values, "note": i.note}
                           for i in p.importances],
            "ncu": [{"name": m.name, "value": m.value, "unit": m.unit} for m in p.ncu],
        } for p in report.problems],
    }  # fmt: skip


# --- files --------------------------------------------------------------------------------------


def os_error_text(exc: OSError, path: str) -> str:
    """One line: which path could not be written and the OS's reason."""
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else path
    return f"cannot write to {where}: {exc.strerror or exc}"


def ensure_out_dir(path: str) -> None:
    """Create the output folder `path` and check a file can be written in it, or raise a one-line TunerError.

    Done before the (possibly long) work whose results go there, so they are not lost to a bad --out.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise TunerError(f"cannot write to {path}: it exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # running as root, os.access would always say yes
            pass
    except OSError as exc:
        raise TunerError(os_error_text(exc, path)) from None


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
    from tuner.reporting import plots

    figures: dict[str, str] = {}

    def draw(key: str, name: str, fn: Any, *args: Any) -> None:
        fn(*args, os.path.join(out_dir, name))
        figures[key] = name

    for p in report.problems:
        draw(f"{p.key}/compare", f"{p.key}-compare.png", plots.plot_comparison, p)
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
