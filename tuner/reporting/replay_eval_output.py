"""What a replay evaluation writes: the per-sampler table (its rows; markdown), a CSV and a figure."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from typing import Optional

from tuner.errors import TunerError
from tuner.reporting.files import ensure_out_dir, os_error_text
from tuner.reporting.markdown import table as markdown_table
from tuner.reporting.plots import plot_replay_eval
from tuner.reporting.replay_eval_model import EvalResult, SamplerSummary, fmt_trials, pct_text
from tuner.store.redact import redact_url


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _spread_text(s: SamplerSummary, pct: float, trials: int) -> str:
    low, high = s.spread(pct)
    return f"{fmt_trials(low, trials)}–{fmt_trials(high, trials)}"


def table_rows(result: EvalResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-sampler summary (shared by the rich table and the markdown)."""
    header = ["sampler"]
    for p in result.thresholds_pct:
        header += [f"median to {pct_text(p)}", f"range to {pct_text(p)}", f"seeds at {pct_text(p)}"]
    header += ["final gap", "regret, in-search best", "regret, confirmed", "s/search"]
    rows = []
    for s in result.summaries:
        row = [s.sampler]
        for p in result.thresholds_pct:
            row += [fmt_trials(s.median(p), result.trials), _spread_text(s, p, result.trials),
                    f"{s.hits(p)}/{len(s.runs)}"]
        gap = s.final_gappct_text(result.recording.best_us)
        row += ["-" if math.isinf(gap) else f"{gap:.2f}%", _pct(s.median_regret(False)), _pct(s.median_regret(True)),
                f"{s.seconds:.1f}"]
        rows.append(row)
    return header, rows


def markdown(result: EvalResult, plot_name: Optional[str] = None) -> str:
    rec = result.recording
    header, rows = table_rows(result)
    lines = [
        f"# Replay evaluation of search samplers: {rec.problem.label}",
        "",
        f"Recording: {rec.caption}; store {redact_url(rec.url)}.",  # the report is shared: no password
        f"Template {rec.template}, {rec.variants} recorded variants"
        + (f", up to {rec.timings} timings each (a replayed measurement draws one; a variant's true time is "
           "their median)" if rec.timings > 1 else "")
        + f"; recorded best {rec.best_us:.3f} µs ({rec.best_variant}).",
        f"Each sampler ran {result.seeds} seeds (0–{result.seeds - 1}) of {result.trials} trials through "
        "`tuner search --backend replay`. A trial is one budgeted trial, a distinct variant: repeats of a "
        "point the study holds and infeasible points (pruned before compiling) are free and do not count. "
        f"\">{result.trials}\" means not reached within the {result.trials} trials (infinity in the median); "
        "final gap: median over seeds of the true time of the last best above the recorded best. Regret: median "
        "over seeds of how far the true time of the variant a search picks is above the recorded best, for the "
        "in-search best (no confirm stage) and the confirm stage's winner (5 variants, 7 rounds, each round "
        "drawing recorded timings).",
        f"Generated {result.generated_at:%Y-%m-%d %H:%M %Z}.",
        "",
        *markdown_table(header, rows),
        f"**{result.best_line()}**",
        "",
    ]
    if plot_name:
        lines += [f"![replay evaluation]({plot_name})", "",
                  f"*Figure: gap to the recorded best by trial, and trials to within "
                  f"{pct_text(result.thresholds_pct[0])} per seed. {rec.caption}.*", ""]
    return "\n".join(lines)


CSV_FIELDS = ("sampler", "seed", "trials", "seconds", "final_best_us", "recorded_best_us", "regret_pct",
              "confirmed_regret_pct")


def write_csv(result: EvalResult, path: str) -> None:
    """One row per (sampler, seed): trials to within each threshold (empty = not reached)."""
    pct_fields = [f"trials_to_{p:g}pct" for p in result.thresholds_pct]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*CSV_FIELDS, *pct_fields])
        for s in result.summaries:
            for i, run in enumerate(s.runs):
                final = run.best_so_far[-1] if run.best_so_far else None
                reached = ["" if s.reached[p][i] is None else s.reached[p][i] for p in result.thresholds_pct]
                writer.writerow([s.sampler, run.seed, len(run.best_so_far), f"{run.seconds:.3f}",
                                 "" if final is None else repr(final), repr(result.recording.best_us),
                                 _csv(run.regret_pct), _csv(run.confirmed_regret_pct), *reached])


def _csv(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4f}"


@dataclass(frozen=True)
class EvalFiles:
    markdown: str
    csv: str
    plot: str


def write_outputs(result: EvalResult, out_dir: str) -> EvalFiles:
    ensure_out_dir(out_dir)
    files = EvalFiles(*(os.path.join(out_dir, n) for n in ("replay_eval.md", "replay_eval.csv", "replay_eval.png")))
    try:
        plot_replay_eval(result, files.plot)
        write_csv(result, files.csv)
        with open(files.markdown, "w") as handle:
            handle.write(markdown(result, os.path.basename(files.plot)))
    except OSError as exc:  # one line, not a traceback
        raise TunerError(os_error_text(exc, out_dir)) from None
    return files
