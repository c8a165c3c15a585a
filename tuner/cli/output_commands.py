"""`tuner profile`, `tuner export`, `tuner report`, `tuner replay-eval`: what comes out of a search."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Annotated, Optional

import typer

from tuner.cli.state import (
    MAX_ID,
    MAX_SEED,
    DbOption,
    at_most,
    console,
    err_console,
    may_create_store,
    output_format,
    say,
    state,
    use_db,
)
from tuner.cli.journal_check import warn_if_journal_damaged_at
from tuner.cli.tables import export_lines, metrics_table, replay_eval_table
from tuner.dtypes import names_text
from tuner.errors import TunerError
from tuner.export.check_cells import cell_line, checked_summary
from tuner.export.run import ExportOptions, export
from tuner.models import load_model, model_problems
from tuner.reporting.profiling import METRICS, metrics_to_json, profile_top, profile_trial
from tuner.reporting.replay_eval import evaluate_samplers
from tuner.reporting.replay_eval_model import EvalOptions
from tuner.reporting.replay_eval_output import write_outputs
from tuner.reporting.report import write_report
from tuner.store import open_store


def profile_command(
    trial_id: Annotated[Optional[int], typer.Argument(min=1, callback=at_most(MAX_ID), help="Trial id to profile (see `tuner results`).")] = None,
    top: Annotated[Optional[int], typer.Option("--top", min=1, callback=at_most(MAX_ID), help="Profile the K fastest ok trials instead (best per problem first).")] = None,
    run: Annotated[Optional[int], typer.Option("--run", min=1, callback=at_most(MAX_ID), help="With --top: only trials of this run.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="With --top: GPU profile name, or part of the GPU name.")] = None,
    ncu: Annotated[str, typer.Option("--ncu", help="The ncu executable (Nsight Compute).")] = "ncu",
    launches: Annotated[int, typer.Option(min=1, max=10_000, help="Kernel launches profiled per trial (metrics are averaged).")] = 3,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    db: DbOption = None,
) -> None:
    """Nsight Compute counters of stored trials (on this machine's GPU), stored with each trial."""
    use_db(db)
    fmt = output_format(fmt, ("table", "json"))
    if (trial_id is None) == (top is None):
        raise TunerError("give either a TRIAL_ID or --top K")
    if trial_id is not None and (run is not None or gpu is not None):
        raise TunerError("--run and --gpu select trials for --top; they do not apply to one TRIAL_ID")
    with open_store(state.db_url, create=may_create_store()) as store:
        if trial_id is not None:
            results = {trial_id: profile_trial(store, trial_id, ncu=ncu, launches=launches)}
        else:
            results = profile_top(store, run, top or 0, gpu, ncu=ncu, launches=launches)
        names = {tid: store.trial_detail(tid).variant_name for tid in results}
    if fmt == "json":
        typer.echo(json.dumps(metrics_to_json(results), indent=2))
        return
    for tid, metrics in results.items():
        console.print(metrics_table(f"trial {tid}: {names[tid]}", metrics, METRICS))


def export_command(
    gpu: Annotated[str, typer.Option(help="GPU profile whose best trials to export (h100, h200, a100, l4; auto: the card present).")],
    out: Annotated[str, typer.Option(help="Folder to write (a pip-installable package, or a header).")],
    shape: Annotated[Optional[list[str]], typer.Option(help="Tuned problem B,H,S,D or B,H,Sq,Sk,D (repeatable).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every problem tuned for --gpu (the default without --shape).")] = False,
    dtype: Annotated[Optional[str], typer.Option(help=f"Only this dtype ({names_text()}).")] = None,
    name: Annotated[Optional[str], typer.Option(help="Python package name (default: the --out folder's name).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="package (Python, importable) or header (C++ constants).")] = "package",
    allow_rebuild: Annotated[bool, typer.Option("--allow-rebuild", help="Accept kernels whose rebuilt cubin differs from the one measured.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an earlier export in --out.")] = False,
    db: DbOption = None,
    model: Annotated[Optional[str], typer.Option(help="Export the problems `tuner search --model` tunes for this model (a preset or a config.json).")] = None,
    check: Annotated[bool, typer.Option("--check", help="On the GPU: time every dispatch cell's kernels against SDPA and route the cells where they lose to SDPA.")] = False,
    kv_cache: Annotated[str, typer.Option("--kv-cache", help="With --model: its decode steps as `tuner search --model --kv-cache e4m3` tuned them (an FP8 KV cache).")] = "",
) -> None:
    """Export the best tuned kernels as an importable package (attention(q, k, v)) or a C++ header."""
    use_db(db)
    if sum(bool(x) for x in (all_, shape, model)) > 1:
        raise TunerError("give one of --shape, --all and --model")
    problems: tuple = ()
    if model is not None:
        if dtype is not None:
            raise TunerError("--model sets the dtype of its problems; drop --dtype (an FP8 KV cache: --kv-cache e4m3)")
        problems = model_problems(load_model(model), kv_cache)
    elif kv_cache:
        raise TunerError("--kv-cache describes --model's decode steps; with --shape, pass --dtype bf16_kv_e4m3 "
                         "or fp16_kv_e4m3")
    warn_if_journal_damaged_at(state.db_url)  # the export reads the trials table alone
    report = export(ExportOptions(
        gpu=gpu, out=Path(out), shapes=tuple(shape or ()), dtype=dtype, name=name, model_problems=problems,
        format=fmt.strip().lower(), allow_rebuild=allow_rebuild, force=force, db_url=state.db_url, check=check,
    ), progress=lambda record: typer.echo(cell_line(record)))
    for note in report.notes:  # what the export cleared up first (a killed export's temporary folders)
        _say_80(f"note: {note}")
    for line in export_lines(report.entries):
        typer.echo(line)
    if report.checked:
        typer.echo(checked_summary(report.checked))
    what = f"package {report.package}" if report.format == "package" else f"header {report.package}.h"
    for line in _wrap_80(f"exported {what}: {len(report.entries)} entries, {report.kernels} kernels -> {report.out}"):
        typer.echo(line)
    replayed = [e for e in report.entries if e["run"].get("replayed_from")]
    if replayed:
        sources = ", ".join(sorted({e["run"]["replayed_from"] for e in replayed}))
        _say_80(f"warning: REPLAYED: {len(replayed)} of {len(report.entries)} entries were timed by `tuner search "
                f"--backend replay` from a recording ({sources}), not measured on a GPU; re-run the search on the "
                "card before relying on them")


def _wrap_80(text: str) -> list[str]:
    """`text` in lines of at most 80 columns, continuation lines indented (a path or URL longer stays whole)."""
    return textwrap.wrap(text, 80, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def _say_80(text: str) -> None:
    """A warning or note on stderr, in lines of at most 80 columns."""
    for line in _wrap_80(text):
        say(line, stderr=True)


def report_command(
    gpu: Annotated[str, typer.Option(help="GPU profile (h100, h200, ...) or part of the GPU name.")],
    out: Annotated[str, typer.Option(help="Folder for report.md, report.json and the PNG figures.")],
    db: DbOption = None,
    run: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="Only trials of this run id.")] = None,
) -> None:
    """Benchmark report: best tuned kernel vs the baselines of its run, search progress, importance, ncu."""
    use_db(db)
    warn_if_journal_damaged_at(state.db_url)  # its parameter importance reads the journal, the rest does not
    files = write_report(state.db_url, gpu, out, run_id=run)
    say(f"wrote {files.markdown}, {files.json} and {len(files.figures)} figures")


def replay_eval_command(
    replay_from: Annotated[str, typer.Option("--from", help="Recording: a results store holding every feasible variant of one problem (tuner search --sampler grid).")],
    samplers: Annotated[str, typer.Option(help="Comma-separated samplers to compare.")] = "tpe,gp,cmaes,random",
    seeds: Annotated[int, typer.Option(min=1, callback=at_most(MAX_SEED), help="Seeds per sampler (0 .. N-1).")] = 5,
    trials: Annotated[int, typer.Option(min=1, callback=at_most(MAX_ID), help="Trials per replayed search.")] = 100,
    shape: Annotated[Optional[str], typer.Option(help="Recorded problem B,H,S,D (default: the one with most variants).")] = None,
    jobs: Annotated[Optional[int], typer.Option(min=1, max=4096, help="Worker processes (default: CPU count).")] = None,
    early_stop: Annotated[Optional[int], typer.Option("--early-stop", min=1, callback=at_most(MAX_ID), help="Each replayed search's --early-stop (default: off, the full --trials).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Folder for replay_eval.md, replay_eval.csv and replay_eval.png.")] = None,
) -> None:
    """Replay each sampler on a full recording: trials to come within 1% and 3% of the recorded best."""
    names = tuple(s.strip().lower() for s in samplers.split(",") if s.strip())
    options = EvalOptions(recording=replay_from, samplers=names, seeds=seeds, trials=trials, shape=shape, jobs=jobs,
                          early_stop=early_stop, out_dir=out)
    result = evaluate_samplers(options, progress=lambda r: err_console.print(
        f"{r.sampler} seed {r.seed}: {len(r.best_so_far)} trials in {r.seconds:.1f} s", markup=False, highlight=False))
    console.print(replay_eval_table(result))
    say(result.best_line())
    if out:
        files = write_outputs(result, out)
        say(f"wrote {files.markdown}, {files.csv}, {files.plot}")
