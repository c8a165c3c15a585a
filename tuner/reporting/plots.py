"""Figures of the benchmark report and the replay evaluation (matplotlib, Agg: no display needed).

We build Figure objects directly instead of using pyplot: no global state, no
GUI backend, nothing left open between figures. Every figure's title names
the card, run and date its numbers come from.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tuner.reporting.replay_eval_model import EvalResult
from tuner.reporting.report_model import TUNED, Importance, ProblemReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TUNED_COLOR = "#2a7ab0"
BASELINE_COLOR = "#b0b0b0"
DPI = 110


def _figure(width: float, height: float) -> Figure:
    # matplotlib is imported on the first figure, not with the CLI (it costs ~0.7 s of every command's start).
    import matplotlib

    matplotlib.use("Agg")  # never a GUI backend
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str, caption: str) -> None:
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, format="png")


def plot_comparison(p: ProblemReport, path: str) -> None:
    """TFLOP/s and µs of the tuned kernel beside every baseline of its run."""
    names = [t.impl for t in p.timings]
    colors = [TUNED_COLOR if t.impl == TUNED else BASELINE_COLOR for t in p.timings]
    fig = _figure(max(8.0, 2.0 * len(names)), 4.2)
    fig.suptitle(f"{p.problem.label} — {p.label.caption}\ntuned: {p.best.variant_name} (trial {p.best.id})",
                 fontsize=9)
    for ax, values, unit, spec in (
        (fig.add_subplot(1, 2, 1), [t.tflops or 0.0 for t in p.timings], "TFLOP/s (higher is better)", ".1f"),
        (fig.add_subplot(1, 2, 2), [t.median_us for t in p.timings], "median µs (lower is better)", ".2f"),
    ):
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.bar_label(bars, labels=[format(v, spec) for v in values], fontsize=7)
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=20, ha="right")
        ax.set_ylabel(unit)
        ax.margins(y=0.15)
    _save(fig, path, f"tuner report: {p.label.caption}")


def plot_confirm(p: ProblemReport, path: str) -> None:
    """In-search µs against the confirm stage's interleaved median µs, per re-timed variant."""
    c = p.confirm
    assert c is not None
    fig = _figure(7, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    shown = [v for v in c.variants if v.in_search_us is not None]
    for v in shown:
        ax.scatter(v.in_search_us, v.confirmed_us, color=TUNED_COLOR if v.name == c.winner else BASELINE_COLOR,
                   s=40 if v.name == c.winner else 20, zorder=3)
    if shown:
        low = min(min(v.in_search_us, v.confirmed_us) for v in shown)
        high = max(max(v.in_search_us, v.confirmed_us) for v in shown)
        ax.plot([low, high], [low, high], color="#888888", linestyle=":", linewidth=1)  # the same time
    ax.set_xlabel("in-search median µs (one timing)")
    ax.set_ylabel(f"confirmed median µs ({c.rounds} interleaved rounds)")
    ax.set_title(f"{p.problem.label}: confirm stage of run {c.run_id} (winner in blue)\n{p.label.caption}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    _save(fig, path, f"tuner report: {p.label.caption}")


def plot_convergence(p: ProblemReport, path: str) -> None:
    """Best-so-far µs against trial number and against wall time, one line per study."""
    fig = _figure(10, 4.2)
    fig.suptitle(f"{p.problem.label}: best so far — {p.curves_label.caption}", fontsize=10)
    by_number, by_time = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for c in p.curves:
        if c.best_by_number:
            by_number.step([n + 1 for n in c.trial_numbers], c.best_by_number, where="post", label=c.study)
            by_time.step(c.elapsed_s, c.best_by_time, where="post", label=c.study)
    if p.best.best_baseline_us is not None:  # the store's pick, as in the report's summary (ties agree)
        for ax in (by_number, by_time):
            ax.axhline(p.best.best_baseline_us, color="#aa3333", linestyle="--", linewidth=1,
                       label=f"{p.best.best_baseline_impl} (run {p.best.run_id})")
    by_number.set_xlabel("trial number")
    by_time.set_xlabel("seconds since the run started")
    for ax in (by_number, by_time):
        ax.set_ylabel("best median µs so far")
        ax.grid(alpha=0.3)
    by_number.legend(fontsize=7)
    _save(fig, path, f"tuner report: {p.curves_label.caption}")


def plot_importance(p: ProblemReport, imp: Importance, path: str) -> None:
    """Horizontal bars of Optuna's parameter importances (largest on top)."""
    items = sorted(imp.values.items(), key=lambda kv: kv[1])
    fig = _figure(7, 0.5 + 0.4 * max(len(items), 3))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh([k for k, _ in items], [v for _, v in items], color=TUNED_COLOR)
    ax.set_xlabel(f"importance ({imp.evaluator})")
    ax.set_title(f"{imp.study}\n{p.label.caption}", fontsize=9)
    _save(fig, path, f"tuner report: {p.label.caption}")


def plot_replay_eval(result: EvalResult, path: str) -> None:
    """Median gap to the recorded best by trial (band: min-max over seeds), and trials to the tightest
    threshold per seed (an x at the right edge: not reached)."""
    rec = result.recording
    tight = result.thresholds_pct[0]
    fig = _figure(11, 4.5)
    fig.suptitle(f"Sampler replay: {rec.problem.label} — {rec.caption}\n"
                 f"{result.seeds} seeds x {result.trials} trials; recorded best {rec.best_us:.3f} µs", fontsize=9)
    gap_ax, hit_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    trials = list(range(1, result.trials + 1))
    for i, s in enumerate(result.summaries):
        gaps = [[(b / rec.best_us - 1) * 100 if b is not None else math.nan for b in run.best_so_far]
                + [math.nan] * (result.trials - len(run.best_so_far)) for run in s.runs]
        columns = list(zip(*gaps))
        median = [_nanmedian(col) for col in columns]
        low = [min((v for v in col if not math.isnan(v)), default=math.nan) for col in columns]
        high = [max((v for v in col if not math.isnan(v)), default=math.nan) for col in columns]
        # dashes differ per sampler: samplers that coincide (cmaes falls back to random here) stay visible
        (line,) = gap_ax.plot(trials, median, label=s.sampler, linestyle=("-", "--", "-.", ":")[i % 4])
        gap_ax.fill_between(trials, low, high, color=line.get_color(), alpha=0.15)
    for pct in result.thresholds_pct:
        gap_ax.axhline(pct, color="#666666", linestyle=":", linewidth=1)
        gap_ax.annotate(f"{pct:g}%", (result.trials, pct), fontsize=7, ha="right", va="bottom", color="#666666")
    gap_ax.set_yscale("symlog", linthresh=1.0)
    gap_ax.set_ylim(bottom=0)
    gap_ax.set_xlabel("trial")
    gap_ax.set_ylabel("best so far above recorded best (%)")
    gap_ax.legend(fontsize=7)
    gap_ax.grid(alpha=0.3)
    edge = result.trials + 1
    for i, s in enumerate(result.summaries):
        values = s.reached[tight]
        hit = [v for v in values if v is not None]
        hit_ax.scatter([i] * len(hit), hit, color=TUNED_COLOR, s=18, zorder=3)
        missed = len(values) - len(hit)
        if missed:
            hit_ax.scatter([i], [edge], marker="x", color="#aa3333", s=30, zorder=3)
            hit_ax.annotate(f"{missed} not reached", (i, edge), fontsize=7, ha="center", va="bottom",
                            xytext=(0, 4), textcoords="offset points")
        median = s.median(tight)
        if not math.isinf(median):
            hit_ax.hlines(median, i - 0.3, i + 0.3, color="black", linewidth=2, zorder=4)
    hit_ax.set_xticks(range(len(result.summaries)), [s.sampler for s in result.summaries])
    hit_ax.set_ylim(0, edge * 1.12)
    hit_ax.set_ylabel(f"trials to within {tight:g}% (bar: median)")
    hit_ax.grid(alpha=0.3, axis="y")
    _save(fig, path, f"tuner replay-eval: {rec.caption}.")


def _nanmedian(values: tuple[float, ...]) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2
