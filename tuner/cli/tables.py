"""How the CLI shows things: rich tables and lines built from data, apart from the commands."""

from __future__ import annotations

import re
import textwrap
from typing import Any, Iterable, Optional

from rich.console import RenderableType
from rich.text import Text

from tuner.cli.fit import Col, FitTable
from tuner.kernels.feasibility import Feasibility
from tuner.kernels.variant import Variant, short_name
from tuner.problem import Problem
from tuner.errors import TunerError
from tuner.profiles import GpuProfile, load_profile
from tuner.reporting.profiling import METRICS
from tuner.reporting.replay_eval_model import EvalResult
from tuner.reporting.replay_eval_output import table_rows
from tuner.search.summary import ProblemSummary
from tuner.store import ConfirmedRow, NcuMetric, TrialDetail, TrialRow

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: object) -> str:
    """Stored text made safe for a terminal: control characters (escape sequences among them) shown
    as \\xNN instead of acting on the screen; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def fmt(value: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def profiles_table(profiles: Iterable[GpuProfile]) -> FitTable:
    table = FitTable("GPU profiles", [
        Col("name", whole=True), Col("card"), Col("arch", whole=True), Col("SMs", "right", whole=True),
        Col("smem/block", "right", whole=True, short="smem"), Col("L2", "right", whole=True),
        Col("peak fp16", "right", whole=True), Col("bandwidth", "right", whole=True),
        Col("problems", "right", whole=True, drop=1),
    ])
    for p in profiles:
        table.add_row(p.name, p.display_name, p.nvcc_arch, str(p.sm_count), f"{p.smem_per_block_optin // 1024} KiB",
                      f"{p.l2_bytes / 2**20:g} MiB", f"{p.peak_fp16_tflops:g} TFLOP/s", f"{p.mem_bandwidth_gbs:g} GB/s",
                      str(len(p.default_problems)))
    return table


def space_table(template: str, profile: GpuProfile, problem: Problem, rows: list[tuple[Variant, Feasibility]],
                show_all: bool) -> FitTable:
    feasible = sum(f.ok for _, f in rows)
    # The full variant name is what `tuner render` takes: the threads, then the smem, give way to it.
    columns = [Col("variant", whole=True), Col("smem", whole=True, drop=1), Col("threads", whole=True, drop=2)] + (
        [Col("reason")] if show_all else [])
    table = FitTable(f"{template} on {profile.name}, {problem.label}: {feasible} feasible", columns)
    for v, f in rows:
        cells = [v.name, f"{f.smem_bytes // 1024} KiB" if f.smem_bytes else "-", str(f.threads or "-")]
        table.add_row(*cells, *((f.reason or "feasible",) if show_all else ()))
    return table


_MASK_SUFFIX = re.compile(r"_(?:causal_)?(?:wl|wr|sc)\d.*$")


def short_variant(name: str) -> str:
    """The tunables part of a variant name (template, head dim and dtype are in other columns);
    `tuner render` takes it back (tuner.kernels.variant.short_name). A window's or softcap's suffix goes
    on a second line (the problem column says them too), so the problem's label keeps its width:
    joined again, the two lines are the name `tuner render` takes."""
    short = short_name(name)
    mask = _MASK_SUFFIX.search(short)
    return short if mask is None else f"{short[:mask.start()]}\n{mask.group(0)}"


def mj(joules: Optional[float]) -> str:
    """J per call shown in millijoules (a kernel's call costs a fraction of a joule): 0.123, 45.6, 1650."""
    if joules is None:
        return "-"
    return f"{joules * 1e3:.0f}" if joules >= 0.1 else f"{joules * 1e3:.3g}"


ENERGY_CAPTION = "mJ: energy per call back to back; TF/W: TFLOP/s per watt"


def results_table(rows: list[TrialRow], best: bool) -> FitTable:
    """One or two lines per trial in 80 columns: the variant by its tunables (`tuner show ID` has
    everything), the card in the title when all rows share one; energy columns where a row has energy."""
    gpus = {printable(r.profile or r.gpu_name) for r in rows}
    energy = any(r.headline_joules is not None for r in rows)
    title = ("best trials" if best else "trials") + (f" on {gpus.pop()}" if len(gpus) == 1 else "")
    columns = [Col("id", "right", whole=True)] + ([Col("gpu")] if len(gpus) > 1 else []) + [
        Col("problem", keep=True), Col("variant", whole=True), Col("status", whole=True), Col("µs", "right", whole=True),
        Col("TFLOP/s", "right", whole=True, drop=1)] + (
        [Col("mJ", "right", whole=True), Col("TF/W", "right", whole=True, drop=2)] if energy else []) + [
        Col("x best", "right", whole=True)]
    # The variant keeps its width; the problem label stays whole unless only wrapping it makes room.
    replayed = any(r.replayed_from for r in rows)
    table = FitTable(title, columns,
                     caption="variant: its tunables (`tuner show ID`: all); c: confirmed by interleaved re-timing"
                             + ("; r: answered from a recording (--backend replay), not measured" if replayed else "")
                             + (f"; {ENERGY_CAPTION}" if energy else ""))
    for row in rows:
        cells = [str(row.id)] + ([printable(row.profile or row.gpu_name)] if len(gpus) > 1 else []) + [
            row.problem.label, printable(short_variant(row.variant_name)), row.status.value, fmt(row.headline_us),
            fmt(row.problem.tflops(row.headline_us) if row.headline_us else None)] + (
            [mj(row.headline_joules), fmt(row.tflops_per_watt, ".2f")] if energy else []) + [
            fmt(row.headline_ratio, ".2f", "x") + (" c" if row.confirmed_us is not None else "")
            + (" r" if row.replayed_from else "")]
        table.add_row(*cells)
    return table


def summary_table(rows: list[ProblemSummary], title: str = "search summary") -> FitTable:
    """Per problem the best variant against the best baseline of its run; in 80 columns without the
    TFLOP/s, then the trials, then the baseline's µs (µs / x) when the names are long."""
    columns = (Col("problem", keep=True), Col("trials", "right", whole=True, drop=2), Col("best", whole=True),
               Col("µs", "right", whole=True), Col("TFLOP/s", "right", whole=True, drop=3),
               Col("baseline", whole=True), Col("µs ", "right", whole=True, drop=1), Col("x", "right", whole=True))
    table = FitTable(title, columns, caption="best: the variant's tunables; c: confirmed, the median per-round "
                                             "ratio of interleaved re-timing" + (
                         "" if all(r.objective == "time" for r in rows) else
                         " (of J per call in an energy search, of isolated µs in an isolated one)"))
    for row in rows:
        table.add_row(row.problem.label, str(row.trials), short_variant(row.best_variant) if row.best_variant else
                      "no ok trial", fmt(row.best_us, ".2f"), fmt(row.best_tflops), row.baseline_impl or "-",
                      fmt(row.baseline_us, ".2f"), fmt(row.ratio, ".2f", "x") + (" c" if row.confirmed else ""))
    return table


# replay-eval's headers (tuner.reporting.replay_eval_output.table_rows) where they leave no room.
_REPLAY_EVAL_SHORT = {"regret, in-search best": "search regret", "regret, confirmed": "conf. regret"}


def replay_eval_table(result: EvalResult) -> FitTable:
    """The per-sampler summary; in 80 columns without the seconds per search, then the trial ranges."""
    rec = result.recording
    header, rows = table_rows(result)
    columns = [Col(header[0], whole=True)] + [
        Col(name, "right", whole=True, short=_REPLAY_EVAL_SHORT.get(name),
            drop=2 if name == "s/search" else 1 if name.startswith("range") else 0) for name in header[1:]]
    table = FitTable(f"replay evaluation: {rec.problem.label} on {rec.caption}", columns)
    for row in rows:
        table.add_row(*row)
    return table


def hanging(line: Text, width: int, indent: int = 2) -> Text:
    """`line` wrapped at spaces to `width` columns, its continuation lines indented so that the labels
    stand out (`tuner show`'s params, template hash, confirm stage); a word wider than the line is cut.
    The styles of its first line (a bold label) are kept."""
    width = max(width, indent + 8)
    out: list[str] = []
    for physical in line.plain.split("\n"):
        out += textwrap.wrap(physical, width, subsequent_indent=" " * indent, break_on_hyphens=False,
                             replace_whitespace=False) or [""]
    wrapped = Text("\n".join(out), style=line.style)
    head = len(out[0])
    for span in line.spans:
        if span.start < head:
            wrapped.stylize(span.style, span.start, min(span.end, head))
    return wrapped


def _line(label: str, value: object) -> Text:
    return Text.assemble((f"{label}: ", "bold"), printable(value))


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def trial_lines(d: TrialDetail) -> list[Text]:
    """The facts of one trial, a line each."""
    best = f" (vs {d.best_baseline_impl}, {fmt(d.best_baseline_us, '.2f')} µs)" if d.best_baseline_impl else ""
    lines = [
        Text(f"trial {d.id}: {printable(d.variant_name)}", style="bold"),
        _line("status", d.status.value),
        _line("problem", f"{d.problem.label} (layout {d.problem.layout}, {d.problem.kernel_pass} pass)"),
        _line("gpu", f"{d.gpu_name} (profile {d.profile}), run {d.run_id}"),
        # What `tuner results` marks r: the figures below are a recording's, not this card's measurement.
        *([_line("replayed", f"from {d.replayed_from} (--backend replay): answered from a recording, not measured")]
          if d.replayed_from else []),
        _line("template", f"{d.template} @ {d.template_hash}"),
    ]
    if d.study is not None:
        lines.append(_line("study", f"{d.study} #{d.trial_number}"))
    lines += [
        _line("params", ", ".join(f"{k}={v}" for k, v in sorted(d.params.items())) or "-"),
        _line("median / p20 / p80", f"{fmt(d.median_us, '.2f')} / {fmt(d.p20_us, '.2f')} / {fmt(d.p80_us, '.2f')} µs"),
        _line("TFLOP/s", fmt(d.tflops, ".1f")),
        *bandwidth_lines(d),
        *energy_lines(d),
        _line("ratio to best baseline", fmt(d.ratio_to_best_baseline, ".3f", "x") + best),
        _line("relative error", fmt(d.rel_error, ".2e")),
        _line("registers / smem / spill",
              f"{_or_dash(d.registers)} / {_or_dash(d.smem_bytes)} B / {_or_dash(d.spill_bytes)} B"),
        _line("compile time", fmt(d.compile_s, ".2f", " s")),
    ]
    if d.cubin_sha256:
        lines.append(_line("cubin sha256", d.cubin_sha256))
    lines.append(_line("source", d.source_path or "-"))
    return lines


SHORT_QUERY = 16  # up to this many queries a call is a decode step: its K/V bytes, not its FLOPs, set its time


def bandwidth_lines(d: TrialDetail) -> list[Text]:
    """A decode step's K/V bandwidth (Problem.kv_bytes per second) and its share of the profile's memory bandwidth."""
    if d.problem.seq_q > SHORT_QUERY or not d.median_us:
        return []
    gbs = d.problem.kv_gbs(d.median_us)
    try:
        share = f", {gbs / load_profile(d.profile).mem_bandwidth_gbs:.0%} of the {d.profile} profile's bandwidth"
    except TunerError:  # a profile this tuner does not ship
        share = ""
    return [_line("K/V bandwidth", f"{gbs:.0f} GB/s ({d.problem.kv_bytes / 1e6:.1f} MB of K and V read once{share})")]


def energy_lines(d: TrialDetail) -> list[Text]:
    """The trial's energy (a dash where its timing was not metered) and isolated time, where measured."""
    lines = []
    if d.energy is not None:
        e = d.energy
        lines.append(_line("energy (back to back)", f"{e.joules_per_call:.3g} J/call at {e.power_w:.0f} W, SM "
                                                    f"{fmt(e.sm_mhz, '.0f')} MHz; {fmt(d.tflops_per_watt, '.3f')} "
                                                    f"TFLOP/s per W"))
    elif d.timing is not None:
        lines.append(_line("energy (back to back)", "- (not metered: a search reads energy on every trial only "
                                                    "with --objective energy, else in its confirm stage)"))
    if d.isolated_us is not None:
        lines.append(_line("isolated calls", f"{d.isolated_us:.2f} µs median (the card idle between calls)"))
    return lines


def baselines_table(d: TrialDetail) -> FitTable:
    energy = any(b.energy is not None for b in d.baselines)
    table = FitTable("baselines (same run)", [Col("impl", whole=True)] + [Col(c, "right", whole=True) for c in (
        "median µs", "p20 µs", "p80 µs", "TFLOP/s", *(("J/call", "TF/W") if energy else ()), "trial speed-up")],
        title_justify="left")
    for b in d.baselines:
        speedup = b.median_us / d.median_us if d.median_us else None
        table.add_row(printable(b.impl), fmt(b.median_us, ".2f"), fmt(b.p20_us, ".2f"), fmt(b.p80_us, ".2f"), fmt(b.tflops),
                      *((fmt(b.energy.joules_per_call if b.energy else None, ".3g"), fmt(b.tflops_per_watt, ".3f"))
                        if energy else ()), fmt(speedup, ".3f", "x"))
    return table


def metrics_table(title: str, metrics: Iterable[NcuMetric], meanings: Optional[dict[str, str]] = None,
                  spec: str = ",.6g") -> FitTable:
    """ncu metrics of one trial; with `meanings`, a column that says what each counts (where the metric
    names leave no room for it, it stands in for them: `--format json` has the names)."""
    columns = [Col("metric", whole=True, drop=1 if meanings else 0), Col("value", "right", whole=True),
               Col("unit", whole=True)] + ([Col("meaning")] if meanings else [])
    table = FitTable(title, columns, title_justify="left")
    for m in metrics:
        table.add_row(printable(m.name), format(m.value, spec), printable(m.unit or ""),
                      *((meanings.get(m.name) or printable(m.name),) if meanings else ()))
    return table


def trial_detail(d: TrialDetail, confirmed: Optional[ConfirmedRow] = None) -> list[RenderableType]:
    """Everything `tuner show` prints about one trial, in order (`confirmed`: it won a confirm stage)."""
    out: list[RenderableType] = list(trial_lines(d))
    if confirmed is not None:
        of = "" if confirmed.objective == "time" else f" of {confirmed.objective}"
        versus = f", {fmt(confirmed.ratio, '.3f', 'x')} {confirmed.baseline_impl} (median per-round ratio{of})" \
            if confirmed.baseline_impl else ""
        joules = f", {confirmed.joules_per_call:.3g} J/call" if confirmed.joules_per_call is not None else ""
        out.append(_line("confirmed", f"winner of the confirm stage of run {confirmed.run_id}: "
                                      f"{fmt(confirmed.median_us, '.2f')} µs{joules}, median of {confirmed.rounds} "
                                      f"interleaved rounds{versus}"))
    if d.baselines:
        out.append(baselines_table(d))
    if d.ncu_metrics:
        out.append(metrics_table("ncu metrics", d.ncu_metrics, METRICS, spec="g"))
    if d.error:
        out.append(_line("error", d.error))
    if d.compile_log:
        out += [Text("compile log:", style="bold"), Text(printable(d.compile_log))]
    return out


def export_lines(entries: list[dict[str, Any]]) -> list[str]:
    """Each exported entry in lines of at most 80 columns: trial, time, ratio and problem, then its kernel and
    notes indented below (a kernel name is too long to share a line with the rest)."""
    lines = []
    for e in entries:
        ratio = f"{e['ratio_to_best_baseline']:.2f}x" if e.get("ratio_to_best_baseline") else "-"
        notes = [] if e["dispatch"] else [f"(shadowed by trial {e['shadowed_by']})"]
        notes += ["[rebuilt]"] if e["rebuilt"] else []
        notes += ["[replayed]"] if e["run"].get("replayed_from") else []
        notes += ["[routed to SDPA: slower than it]"] if e.get("route") == "sdpa" else []
        lines.append(f"  trial {e['trial_id']:>6} {e['median_us']:>9.1f} us {ratio:>6}  {e['problem_label']}")
        line = f"    {e['kernel']}"
        for note in notes:  # a note is never split: it goes whole onto the next line
            if len(line) + 1 + len(note) > 80:
                lines.append(line)
                line = "    "
            line += ("" if line.isspace() else " ") + note
        lines.append(line)
        lines += _backward_lines(e)
    return lines


def _backward_lines(entry: dict[str, Any]) -> list[str]:
    """The entry's shipped backward, or why none ships (a package's entries say; a header's have no backward)."""
    import textwrap

    if "backward_note" not in entry:
        return []
    text = (f"backward: {entry['backward']['kernel']} ({entry['backward_note'].split(': ', 1)[-1]})"
            if entry.get("backward") else f"backward: SDPA's ({entry['backward_note']})")
    return textwrap.wrap(text, 80, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False)
