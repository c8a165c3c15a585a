"""report.md and report.json of a gathered BenchmarkReport."""

from __future__ import annotations

from typing import Any, Optional

import tuner
from tuner.reporting.markdown import fmt as _f
from tuner.reporting.markdown import table as _table
from tuner.reporting.report_model import TUNED, BenchmarkReport, ProblemReport


def _figure(lines: list[str], figures: dict[str, str], key: str, number: list[int], caption: str) -> None:
    """Append the figure `key` (if drawn) with a numbered caption naming card and run."""
    if key in figures:
        number[0] += 1
        lines += [f"![{caption}]({figures[key]})", "", f"*Figure {number[0]}: {caption}*", ""]


def render_markdown(report: BenchmarkReport, figures: Optional[dict[str, str]] = None) -> str:
    """report.md; `figures` maps figure keys (see write_report) to file names relative to it."""
    figures = figures or {}
    number = [0]
    lines = [f"# Benchmark report: {', '.join(report.gpu_names)} (--gpu {report.gpu})", ""]
    if report.synthetic:
        lines += ["> **SYNTHETIC data**: some runs below come from a synthetic recording (made-up timings, "
                  "host \"synthetic\"), not from a GPU.", ""]
    if report.replayed_from:
        lines += [f"> **REPLAYED**: some runs below were answered from a recording ({', '.join(report.replayed_from)}) "
                  "by `tuner search --backend replay`: their timings were measured by the recording's run, not "
                  "by them.", ""]
    scope = f", run {report.run_id} only" if report.run_id is not None else ""
    lines += [f"Results store {report.db_url}{scope}; generated {report.generated_at:%Y-%m-%d %H:%M} UTC by "
              f"tuner {tuner.__version__}. Each row compares numbers of one card and one run, named in the row; "
              "speed-up = baseline µs / tuned µs (> 1: the tuned kernel is faster).", ""]
    lines += ["## Summary", ""]
    rows = []
    for p in report.problems:
        # baseline, its µs and the speed-up all from the store's one choice (a second pick could differ on ties)
        tuned = p.timings[0]
        base = next((t for t in p.timings if t.impl == p.best.best_baseline_impl), None)
        rows.append([p.problem.label, p.label.gpu_name, str(p.best.run_id), p.label.date, p.best.variant_name,
                     _f(p.best.median_us, ".3f"), _f(p.best.tflops, ".1f"), _j(tuned.joules_per_call),
                     _f(tuned.tflops_per_watt, ".3f"), p.best.best_baseline_impl or "-",
                     _f(p.best.best_baseline_us, ".3f"), _f(p.best.ratio_to_best_baseline, ".3f", "x"),
                     _j(base.joules_per_call if base else None), _f(base.tflops_per_watt if base else None, ".3f")])
    lines += _table(["problem", "card", "run", "date", "best variant", "µs", "TFLOP/s", "J/call", "TFLOP/s per W",
                     "best baseline", "baseline µs", "speed-up", "baseline J/call", "baseline TFLOP/s per W"], rows,
                    right_from=5)
    lines += ["J/call: energy per call back to back (the card at its power limit, board power x median time); "
              "TFLOP/s per W = TFLOP per joule. A search reads energy in its confirm stage (the median of the rounds "
              "is shown) and on every trial only with --objective energy; - where nothing was metered (or NVML "
              "is missing).", ""]
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
             _f(t.tflops, ".1f"), _j(t.joules_per_call), _f(t.power_w, ".0f"), _f(t.tflops_per_watt, ".3f"),
             "1.000x" if t.impl == TUNED else _f(p.ratios.get(t.impl), ".3f", "x")]
            for t in p.timings]
    lines += _table(["implementation", "µs", "TFLOP/s", "J/call", "W", "TFLOP/s per W", "speed-up of tuned"], rows)
    if len(p.timings) == 1:
        lines += [f"No baselines were recorded in run {p.best.run_id}.", ""]
    lines += _confirm_lines(p, figures, number)
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


def _confirm_lines(p: ProblemReport, figures: dict[str, str], number: list[int]) -> list[str]:
    c = p.confirm
    if c is None:
        return ["No confirm stage for this problem (`tuner confirm` re-times the best variants).", ""]
    of = "" if c.objective == "time" else (" of J per call" if c.objective == "energy" else " of isolated µs")
    lines = ["### Confirm stage", "",
             f"Run {c.run_id} re-timed {len(c.variants)} variants in {c.rounds} rounds interleaved with the "
             f"baselines; the winner, `{c.winner}`, has the best median per-round ratio{of} to "
             f"{c.baseline_impl or '-'}.", ""]
    _figure(lines, figures, f"{p.key}/confirm", number,
            f"{p.problem.label}: in-search vs confirmed µs of the re-timed variants — {p.label.caption}.")
    rows = [[f"`{v.name}`" + (" (winner)" if v.name == c.winner else ""), _f(v.in_search_us, ".3f"),
             _f(v.confirmed_us, ".3f"), _j(v.joules_per_call), _f(v.ratio, ".3f", "x"), str(v.rounds)]
            for v in c.variants]
    return lines + _table(["variant", "in-search µs", "confirmed µs", "confirmed J/call",
                           f"x {c.baseline_impl or 'baseline'} (µs)", "rounds (fewer: stopped early as clearly slower)"],
                          rows)


def _j(joules: Optional[float]) -> str:
    return _f(joules, ".4g")


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
            "replayed_from": p.label.replayed_from,
            "best_trial_id": p.best.id, "best_variant": p.best.variant_name, "best_us": p.best.median_us,
            "best_tflops": p.best.tflops, "best_baseline_impl": p.best.best_baseline_impl,
            "ratio_to_best_baseline": p.best.ratio_to_best_baseline,
            "timings": [{"impl": t.impl, "median_us": t.median_us, "tflops": t.tflops, "joules_per_call": t.joules_per_call,
                         "power_w": t.power_w, "tflops_per_watt": t.tflops_per_watt} for t in p.timings],
            "ratios": p.ratios,
            "studies": [{"study": c.study, "run_ids": list(c.run_ids), "trials": c.trials,
                         "best_us": c.best_by_number[-1] if c.best_by_number else None} for c in p.curves],
            "importance": [{"study": i.study, "evaluator": i.evaluator, "values": i.values, "note": i.note}
                           for i in p.importances],
            "ncu": [{"name": m.name, "value": m.value, "unit": m.unit} for m in p.ncu],
            "confirm": None if p.confirm is None else {
                "run_id": p.confirm.run_id, "rounds": p.confirm.rounds, "winner": p.confirm.winner,
                "baseline_impl": p.confirm.baseline_impl, "objective": p.confirm.objective,
                "variants": [{"name": v.name, "in_search_us": v.in_search_us, "confirmed_us": v.confirmed_us,
                              "ratio": v.ratio, "rounds": v.rounds, "joules_per_call": v.joules_per_call}
                             for v in p.confirm.variants]},
        } for p in report.problems],
    }  # fmt: skip
