"""The `tuner` command line. Thin: parse, call one service function, print."""

from __future__ import annotations

import sys
import warnings
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console

from tuner.errors import TunerError

app = typer.Typer(
    name="tuner",
    help="Autotune and profile fused attention kernels on NVIDIA GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


class State:
    """Options shared by every command (set by the top-level callback)."""

    db_url: Optional[str] = None


state = State()


@app.callback()
def _root(
    db: Annotated[
        Optional[str],
        typer.Option("--db", envvar="TUNER_DB", help="Results store URL (sqlite:///path or postgresql://...)."),
    ] = None,
) -> None:
    state.db_url = db


# --- tuner profiles (owner: profiles) -------------------------------------


class ProfilesFormat(str, Enum):
    table = "table"
    json = "json"


@app.command("profiles")
def profiles_command(
    output_format: Annotated[
        ProfilesFormat,
        typer.Option("--format", help="table (default) or json (every field of every profile)."),
    ] = ProfilesFormat.table,
) -> None:
    """List the GPU profiles shipped with the tuner (works without a GPU)."""
    import json

    from rich.table import Table

    from tuner.profiles import list_profiles

    profiles = list_profiles()
    if output_format is ProfilesFormat.json:
        typer.echo(json.dumps([p.to_dict() for p in profiles], indent=2))
        return
    table = Table(title="GPU profiles")
    for column, justify in (
        ("name", "left"), ("card", "left"), ("arch", "left"), ("SMs", "right"), ("smem/block", "right"),
        ("L2", "right"), ("peak fp16", "right"), ("bandwidth", "right"), ("problems", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for p in profiles:
        table.add_row(
            p.name,
            p.display_name,
            p.nvcc_arch,
            str(p.sm_count),
            f"{p.smem_per_block_optin // 1024} KiB",
            f"{p.l2_bytes / 2**20:g} MiB",
            f"{p.peak_fp16_tflops:g} TFLOP/s",
            f"{p.mem_bandwidth_gbs:g} GB/s",
            str(len(p.default_problems)),
        )
    console.print(table)


# --- tuner space / render (owner: templates) ------------------------------


@app.command("space")
def space_command(
    gpu: Annotated[str, typer.Option(help="GPU profile name (h100, h200, a100, l4) or auto.")],
    shape: Annotated[str, typer.Option(help="Problem shape B,H,S,D or B,H,Sq,Sk,D.")],
    dtype: Annotated[str, typer.Option(help="fp16 or bf16.")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal", help="Causal masking.")] = False,
    hkv: Annotated[Optional[int], typer.Option(help="K/V heads (GQA); default: same as heads.")] = None,
    template: Annotated[Optional[str], typer.Option(help="Kernel template name (default: the profile's first that suits the problem).")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list infeasible variants with the reason.")] = False,
    output_format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """List the variants of a template that fit a problem on a GPU (no GPU needed)."""
    import json

    from rich.table import Table

    from tuner.kernels.feasibility import default_template, space_report
    from tuner.problem import problem_from_shape
    from tuner.profiles import load_profile, resolve_profile

    fmt = _output_format(output_format, ("table", "json"))
    # Offline: a named profile is used whatever card this machine has; only "auto" looks at it.
    profile = resolve_profile(gpu) if gpu.strip().lower() == "auto" else load_profile(gpu)
    problem = problem_from_shape(shape, dtype=dtype, causal=causal, heads_kv=hkv)
    template = template or default_template(profile, [problem])
    rows = [(v, f) for v, f in space_report(template, problem, profile) if f.ok or show_all]
    if fmt == "json":
        typer.echo(json.dumps([{**v.to_dict(), "feasible": f.ok, "reason": f.reason or None,
                                "smem_bytes": f.smem_bytes, "threads": f.threads} for v, f in rows], indent=2))
        return
    feasible = sum(f.ok for _, f in rows)
    table = Table(title=f"{template} on {profile.name}, {problem.label}: {feasible} feasible")
    for column in ("variant", "smem", "threads") + (("reason",) if show_all else ()):
        table.add_column(column)
    for v, f in rows:
        cells = [v.name, f"{f.smem_bytes // 1024} KiB" if f.smem_bytes else "-", str(f.threads or "-")]
        table.add_row(*cells, *((f.reason or "feasible",) if show_all else ()))
    console.print(table)


@app.command("render")
def render_command(
    variant: Annotated[str, typer.Argument(help="Variant name, e.g. attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg.")],
) -> None:
    """Print the CUDA source of one variant (the template plus its instantiation)."""
    from tuner.kernels.variant import parse_variant_name
    from tuner.kernels.manifest import render

    typer.echo(render(parse_variant_name(variant)), nl=False)


# --- tuner results / show / db (owner: store) ----------------------------

from tuner.store import default_db_url as _default_db_url  # noqa: E402
from tuner.store import redact_url as _redact_url  # noqa: E402

_STORE_EPILOG = f"Results store: {_redact_url(_default_db_url())} (change it with --db or TUNER_DB)."
_OUTPUT_FORMATS = ("table", "json", "csv")


def _may_create_store() -> bool:
    """Readers create only the default store (a first `tuner results` shows an empty
    table); a --db/TUNER_DB that names no existing store is a typo to report."""
    return state.db_url is None


def _output_format(value: str, allowed: tuple[str, ...]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise TunerError(f"unknown format {value!r}; expected one of {', '.join(allowed)}")
    return value


def _fmt(value: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


@app.command("results", epilog=_STORE_EPILOG)
def results_command(
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile name, or part of the GPU name.")] = None,
    shape: Annotated[Optional[str], typer.Option(help="Problem shape B,H,S,D or B,H,Sq,Sk,D.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="fp16 or bf16.")] = None,
    causal: Annotated[Optional[bool], typer.Option("--causal/--no-causal", help="Only causal / non-causal.")] = None,
    template: Annotated[Optional[str], typer.Option(help="Kernel template name.")] = None,
    status: Annotated[
        Optional[str], typer.Option(help="ok, pruned, compile_error, launch_error, timeout or incorrect.")
    ] = None,
    best: Annotated[bool, typer.Option("--best", help="Only the fastest ok trial per problem and GPU profile.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 50,
    output_format: Annotated[str, typer.Option("--format", help="table, json or csv.")] = "table",
) -> None:
    """List stored trials (newest first), or the best one per problem with --best."""
    import csv
    import io
    import json

    from rich.table import Table

    from tuner.problem import parse_shape
    from tuner.store import TrialFilter, open_store

    fmt = _output_format(output_format, _OUTPUT_FORMATS)
    filt = TrialFilter(
        gpu=gpu,
        shape=parse_shape(shape) if shape else None,
        dtype=dtype,
        causal=causal,
        template=template,
        status=status,
        limit=limit,
    )
    with open_store(state.db_url, create=_may_create_store()) as store:
        rows = store.best_trials(filt) if best else store.query_trials(filt)
        where = store.url
    if fmt == "json":
        typer.echo(json.dumps([row.to_dict() for row in rows], indent=2))
        return
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=rows[0].CSV_FIELDS if rows else _csv_fields(), lineterminator="\n")
        writer.writeheader()
        writer.writerows(row.csv_row() for row in rows)
        typer.echo(buffer.getvalue(), nl=False)
        return
    table = Table(title="best trials" if best else "trials")
    for column, justify in (
        ("id", "right"), ("GPU", "left"), ("problem", "left"), ("variant", "left"), ("status", "left"),
        ("median µs", "right"), ("TFLOP/s", "right"), ("vs best baseline", "right"),
    ):  # fmt: skip
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            str(row.id),
            row.profile or row.gpu_name,
            row.problem.label,
            row.variant_name,
            row.status.value,
            _fmt(row.median_us),
            _fmt(row.tflops),
            _fmt(row.ratio_to_best_baseline, ".2f", "x"),
        )
    console.print(table if rows else "no trials match", markup=False, highlight=False)
    console.print(f"store: {where}", markup=False, highlight=False, soft_wrap=True)


def _csv_fields() -> tuple[str, ...]:
    from tuner.store import TrialRow

    return TrialRow.CSV_FIELDS


@app.command("show", epilog=_STORE_EPILOG)
def show_command(
    trial_id: Annotated[int, typer.Argument(help="Trial id (see `tuner results`).")],
    output_format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Everything stored about one trial: parameters, timings, baselines, ncu metrics, errors."""
    import json

    from rich.table import Table
    from rich.text import Text

    from tuner.store import open_store

    fmt = _output_format(output_format, ("table", "json"))
    with open_store(state.db_url, create=_may_create_store()) as store:
        d = store.trial_detail(trial_id)
    if fmt == "json":
        typer.echo(json.dumps(d.to_dict(), indent=2))
        return

    def line(label: str, value: object) -> None:
        console.print(Text.assemble((f"{label}: ", "bold"), str(value)), soft_wrap=True)

    console.print(Text(f"trial {d.id}: {d.variant_name}", style="bold"))
    line("status", d.status.value)
    line("problem", f"{d.problem.label} (layout {d.problem.layout})")
    line("gpu", f"{d.gpu_name} (profile {d.profile}), run {d.run_id}")
    line("template", f"{d.template} @ {d.template_hash}")
    if d.study is not None:
        line("study", f"{d.study} #{d.trial_number}")
    line("params", ", ".join(f"{k}={v}" for k, v in sorted(d.params.items())) or "-")
    line("median / p20 / p80", f"{_fmt(d.median_us, '.2f')} / {_fmt(d.p20_us, '.2f')} / {_fmt(d.p80_us, '.2f')} µs")
    line("TFLOP/s", _fmt(d.tflops, ".1f"))
    best = f" (vs {d.best_baseline_impl}, {_fmt(d.best_baseline_us, '.2f')} µs)" if d.best_baseline_impl else ""
    line("ratio to best baseline", _fmt(d.ratio_to_best_baseline, ".3f", "x") + best)
    line("relative error", _fmt(d.rel_error, ".2e"))
    line("registers / smem / spill", f"{d.registers if d.registers is not None else '-'} / "
         f"{d.smem_bytes if d.smem_bytes is not None else '-'} B / {d.spill_bytes if d.spill_bytes is not None else '-'} B")  # fmt: skip
    line("compile time", _fmt(d.compile_s, ".2f", " s"))
    if d.cubin_sha256:
        line("cubin sha256", d.cubin_sha256)
    line("source", d.source_path or "-")
    if d.baselines:
        table = Table(title="baselines (same run)", title_justify="left")
        for column in ("impl", "median µs", "p20 µs", "p80 µs", "TFLOP/s", "trial speed-up"):
            table.add_column(column, justify="left" if column == "impl" else "right")
        for b in d.baselines:
            speedup = b.median_us / d.median_us if d.median_us else None
            table.add_row(b.impl, _fmt(b.median_us, ".2f"), _fmt(b.p20_us, ".2f"), _fmt(b.p80_us, ".2f"),
                          _fmt(b.tflops), _fmt(speedup, ".3f", "x"))  # fmt: skip
        console.print(table)
    if d.ncu_metrics:
        table = Table(title="ncu metrics", title_justify="left")
        for column, justify in (("name", "left"), ("value", "right"), ("unit", "left")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for m in d.ncu_metrics:
            table.add_row(m.name, f"{m.value:g}", m.unit or "")
        console.print(table)
    if d.error:
        line("error", d.error)
    if d.compile_log:
        console.print(Text("compile log:", style="bold"))
        console.print(Text(d.compile_log), soft_wrap=True)


db_app = typer.Typer(help="The results store: schema revision and migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db", epilog=_STORE_EPILOG)


@db_app.command("info", epilog=_STORE_EPILOG)
def db_info_command() -> None:
    """Print the store URL (password hidden), backend and schema revision."""
    from tuner.store import store_info

    info = store_info(state.db_url)
    line = "up to date" if info.up_to_date else "outdated: run `tuner db upgrade`"
    if info.revision is None:
        line = "empty: created on first use"
    for text in (f"url: {info.url}", f"backend: {info.backend}",
                 f"revision: {info.revision or '-'} (newest {info.head}, {line})"):  # fmt: skip
        console.print(text, markup=False, highlight=False, soft_wrap=True)


@db_app.command("upgrade", epilog=_STORE_EPILOG)
def db_upgrade_command() -> None:
    """Migrate the store's schema to the newest revision (creates a new store)."""
    from tuner.store import redact_url, upgrade_store

    before, after = upgrade_store(state.db_url)
    where = redact_url(state.db_url or _default_db_url())
    if before == after:
        message = f"{where} is already at revision {after}"
    else:
        message = f"upgraded {where} from revision {before or 'none'} to {after}"
    console.print(message, markup=False, highlight=False, soft_wrap=True)


# --- tuner search / worker (owner: search) --------------------------------


def _parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m' -> seconds."""
    import re

    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise TunerError(f"malformed duration {text!r}: expected e.g. 90s, 10m or 1h30m")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise TunerError(f"duration must be positive, got {text!r}")
    return seconds


def _parse_devices(text: str) -> tuple[int, ...]:
    try:
        devices = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise TunerError(f"malformed --devices {text!r}: expected device indices such as 0,1") from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise TunerError(f"malformed --devices {text!r}: expected distinct device indices such as 0,1")
    return devices


def _print_search_report(report: object) -> None:
    from tuner.search.summary import summary_table

    console.print(summary_table(report.summaries))  # type: ignore[attr-defined]
    console.print(
        f"measured {report.measured} trials, reused {report.reused} from the store, "  # type: ignore[attr-defined]
        f"skipped {report.infeasible} infeasible points; "  # type: ignore[attr-defined]
        f"runs {', '.join(map(str, report.run_ids)) or '-'}; studies {', '.join(report.studies)}",  # type: ignore[attr-defined]
        markup=False, highlight=False, soft_wrap=True,
    )
    if report.interrupted:  # type: ignore[attr-defined]
        err_console.print("interrupted: every finished trial is stored; continue with --resume", markup=False)
        # Not typer.Exit: with standalone_mode=False click returns its code instead of raising it.
        sys.exit(130)


@app.command("search", epilog=_STORE_EPILOG)
def search_command(
    gpu: Annotated[str, typer.Option(help="GPU profile (h100, h200, a100, l4) or auto (the GPU present).")] = "auto",
    shape: Annotated[Optional[list[str]], typer.Option(help="Problem B,H,S,D or B,H,Sq,Sk,D (repeatable); default: the profile's problems.")] = None,
    hkv: Annotated[Optional[int], typer.Option(help="K/V heads (GQA/MQA); default: same as H.")] = None,
    dtype: Annotated[str, typer.Option(help="fp16 or bf16.")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal", help="Causal masking.")] = False,
    layout: Annotated[str, typer.Option(help="bhsd or bshd.")] = "bhsd",
    template: Annotated[Optional[str], typer.Option(help="Kernel template (default: the first of the profile's templates that suits every problem; h100/h200: attn_fwd_wgmma).")] = None,
    trials: Annotated[Optional[int], typer.Option(help="Feasible trials per problem (default 100; every feasible point with --sampler grid).")] = None,
    time_budget: Annotated[Optional[str], typer.Option("--time-budget", help="Stop starting trials after this long, e.g. 10m (shared by the problems).")] = None,
    sampler: Annotated[str, typer.Option(help="tpe, gp, cmaes, random or grid.")] = "tpe",
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed.")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: <gpu>-<template>-<problem>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an existing study up to its trial budget.")] = False,
    devices: Annotated[str, typer.Option(help="GPU indices, one worker process each, e.g. 0,1.")] = "0",
    db: Annotated[Optional[str], typer.Option("--db", help="Results store URL (overrides tuner --db / TUNER_DB).")] = None,
    profile_top: Annotated[int, typer.Option("--profile-top", min=0, help="Profile the K best trials with ncu afterwards.")] = 0,
    backend: Annotated[str, typer.Option(help="gpu (measure) or replay (answer from a recorded store, see --from).")] = "gpu",
    replay_from: Annotated[Optional[str], typer.Option("--from", help="Results store URL to replay (--backend replay).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Use --gpu's profile even if the card does not match.")] = False,
) -> None:
    """Tune kernels with Optuna: each trial is checked, compiled, measured and stored; ends with a summary."""
    from tuner.search.run import SearchOptions, run_search

    options = SearchOptions(
        gpu=gpu, shapes=tuple(shape or ()), heads_kv=hkv, dtype=dtype, causal=causal, layout=layout,
        template=template, trials=trials, time_budget_s=_parse_duration(time_budget) if time_budget else None,
        sampler=sampler.strip().lower(), seed=seed, study=study, resume=resume, devices=_parse_devices(devices),
        db_url=db or state.db_url, backend=backend.strip().lower(), replay_from=replay_from, force=force,
        profile_top=profile_top,
    )
    _print_search_report(run_search(options, console=err_console))


@app.command("worker", epilog=_STORE_EPILOG)
def worker_command(
    study: Annotated[list[str], typer.Option(help="Study created by `tuner search` (repeatable).")],
    storage: Annotated[str, typer.Option(help="Optuna storage: postgresql://... or the SQLite results URL / journal file.")],
    db: Annotated[Optional[str], typer.Option("--db", help="Results store URL (default: the storage's database when PostgreSQL).")] = None,
    backend: Annotated[str, typer.Option(help="gpu or replay.")] = "gpu",
    replay_from: Annotated[Optional[str], typer.Option("--from", help="Results store URL to replay (--backend replay).")] = None,
    trials: Annotated[Optional[int], typer.Option(min=1, help="Trials to run per study (default: what is left of its budget).")] = None,
    time_budget: Annotated[Optional[str], typer.Option("--time-budget", help="Stop starting trials after this long.")] = None,
    device: Annotated[int, typer.Option(min=0, help="GPU index.")] = 0,
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replay a recording from another card than the study's profile.")] = False,
) -> None:
    """Join existing studies from this host (shared PostgreSQL storage) and work on them."""
    from tuner.search.run import run_join

    report = run_join(
        study, storage, db_url=db or state.db_url, backend=backend.strip().lower(), replay_from=replay_from,
        trials=trials, device=device, time_budget_s=_parse_duration(time_budget) if time_budget else None,
        seed=seed, force=force, console=err_console,
    )
    _print_search_report(report)


# --- tuner profile (owner: profiling) -------------------------------------


@app.command("profile", epilog=_STORE_EPILOG)
def profile_command(
    trial_id: Annotated[Optional[int], typer.Argument(help="Trial id to profile (see `tuner results`).")] = None,
    top: Annotated[Optional[int], typer.Option("--top", min=1, help="Profile the K fastest ok trials instead (best per problem first).")] = None,
    run: Annotated[Optional[int], typer.Option("--run", help="With --top: only trials of this run.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="With --top: GPU profile name, or part of the GPU name.")] = None,
    ncu: Annotated[str, typer.Option("--ncu", help="The ncu executable (Nsight Compute).")] = "ncu",
    launches: Annotated[int, typer.Option(min=1, help="Kernel launches profiled per trial (metrics are averaged).")] = 3,
    output_format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """Nsight Compute counters of stored trials (on this machine's GPU), stored with each trial."""
    import json

    from rich.table import Table

    from tuner.reporting.profiling import METRICS, metrics_to_json, profile_top, profile_trial
    from tuner.store import open_store

    fmt = _output_format(output_format, ("table", "json"))
    if (trial_id is None) == (top is None):
        raise TunerError("give either a TRIAL_ID or --top K")
    if trial_id is not None and (run is not None or gpu is not None):
        raise TunerError("--run and --gpu select trials for --top; they do not apply to one TRIAL_ID")
    with open_store(state.db_url, create=_may_create_store()) as store:
        if trial_id is not None:
            results = {trial_id: profile_trial(store, trial_id, ncu=ncu, launches=launches)}
        else:
            results = profile_top(store, run, top or 0, gpu, ncu=ncu, launches=launches)
        names = {tid: store.trial_detail(tid).variant_name for tid in results}
    if fmt == "json":
        typer.echo(json.dumps(metrics_to_json(results), indent=2))
        return
    for tid, metrics in results.items():
        table = Table(title=f"trial {tid}: {names[tid]}", title_justify="left")
        for column, justify in (("metric", "left"), ("value", "right"), ("unit", "left"), ("meaning", "left")):
            table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for m in metrics:
            table.add_row(m.name, f"{m.value:,.6g}", m.unit or "", METRICS.get(m.name, ""))
        console.print(table)


# --- tuner export (owner: export) -----------------------------------------


@app.command("export", epilog=_STORE_EPILOG)
def export_command(
    gpu: Annotated[str, typer.Option(help="GPU profile whose best trials to export (h100, h200, a100, l4).")],
    out: Annotated[str, typer.Option(help="Folder to write (a pip-installable package, or a header).")],
    shape: Annotated[Optional[list[str]], typer.Option(help="Tuned problem B,H,S,D or B,H,Sq,Sk,D (repeatable).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every problem tuned for --gpu (the default without --shape).")] = False,
    dtype: Annotated[Optional[str], typer.Option(help="Only this dtype (fp16 or bf16).")] = None,
    name: Annotated[Optional[str], typer.Option(help="Python package name (default: the --out folder's name).")] = None,
    output_format: Annotated[str, typer.Option("--format", help="package (Python, importable) or header (C++ constants).")] = "package",
    allow_rebuild: Annotated[bool, typer.Option("--allow-rebuild", help="Accept kernels whose rebuilt cubin differs from the one measured.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an earlier export in --out.")] = False,
) -> None:
    """Export the best tuned kernels as an importable package (attention(q, k, v)) or a C++ header."""
    from pathlib import Path

    from tuner.export.package import ExportOptions, export

    if all_ and shape:
        raise TunerError("give --shape or --all, not both")
    report = export(ExportOptions(
        gpu=gpu, out=Path(out), shapes=tuple(shape or ()), dtype=dtype, name=name,
        format=output_format.strip().lower(), allow_rebuild=allow_rebuild, force=force, db_url=state.db_url,
    ))
    for e in report.entries:
        ratio = f"{e['ratio_to_best_baseline']:.2f}x" if e.get("ratio_to_best_baseline") else "-"
        note = "" if e["dispatch"] else f" (shadowed by trial {e['shadowed_by']})"
        note += " [rebuilt]" if e["rebuilt"] else ""
        typer.echo(f"  trial {e['trial_id']:>6}  {e['problem_label']:<34} {e['median_us']:>10.1f} us  {ratio:>6}  {e['kernel']}{note}")
    what = f"package {report.package}" if report.format == "package" else f"header {report.package}.h"
    typer.echo(f"exported {what}: {len(report.entries)} entries, {report.kernels} kernels -> {report.out}")


# --- tuner report / replay-eval (owner: report) ---------------------------


@app.command("report", epilog=_STORE_EPILOG)
def report_command(
    gpu: Annotated[str, typer.Option(help="GPU profile (h100, h200, ...) or part of the GPU name.")],
    out: Annotated[str, typer.Option(help="Folder for report.md, report.json and the PNG figures.")],
    db: Annotated[Optional[str], typer.Option("--db", help="Results store URL (overrides tuner --db / TUNER_DB).")] = None,
    run: Annotated[Optional[int], typer.Option(help="Only trials of this run id.")] = None,
) -> None:
    """Benchmark report: best tuned kernel vs the baselines of its run, search progress, importance, ncu."""
    from tuner.reporting.report import write_report

    files = write_report(db or state.db_url, gpu, out, run_id=run)
    console.print(f"wrote {files.markdown}, {files.json} and {len(files.figures)} figures",
                  markup=False, highlight=False, soft_wrap=True)


@app.command("replay-eval")
def replay_eval_command(
    replay_from: Annotated[str, typer.Option("--from", help="Recording: a results store holding every feasible variant of one problem (tuner search --sampler grid).")],
    samplers: Annotated[str, typer.Option(help="Comma-separated samplers to compare.")] = "tpe,gp,cmaes,random",
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per sampler (0 .. N-1).")] = 5,
    trials: Annotated[int, typer.Option(min=1, help="Trials per replayed search.")] = 100,
    shape: Annotated[Optional[str], typer.Option(help="Recorded problem B,H,S,D (default: the one with most variants).")] = None,
    jobs: Annotated[Optional[int], typer.Option(min=1, help="Worker processes (default: CPU count).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Folder for replay_eval.md, replay_eval.csv and replay_eval.png.")] = None,
) -> None:
    """Replay each sampler on a full recording: trials to come within 1% and 3% of the recorded best."""
    from tuner.reporting.replay_eval import EvalOptions, evaluate_samplers, rich_table, write_outputs

    names = tuple(s.strip().lower() for s in samplers.split(",") if s.strip())
    options = EvalOptions(recording=replay_from, samplers=names, seeds=seeds, trials=trials, shape=shape, jobs=jobs,
                          out_dir=out)
    result = evaluate_samplers(options, progress=lambda r: err_console.print(
        f"{r.sampler} seed {r.seed}: {len(r.best_so_far)} trials in {r.seconds:.1f} s", markup=False, highlight=False))
    console.print(rich_table(result))
    console.print(result.best_line(), markup=False, highlight=False, soft_wrap=True)
    if out:
        files = write_outputs(result, out)
        console.print(f"wrote {files.markdown}, {files.csv}, {files.plot}", markup=False, highlight=False, soft_wrap=True)


# Usage errors (bad option, unknown command) print click's short message. Recent
# typer releases vendor click as typer._click and no longer depend on click itself.
_CLICK_ERRORS: tuple[type[Exception], ...] = ()
try:
    from typer._click.exceptions import ClickException as _TyperClickException

    _CLICK_ERRORS += (_TyperClickException,)
except ImportError:  # a typer that uses click itself
    pass
try:
    from click import ClickException as _ClickException

    _CLICK_ERRORS += (_ClickException,)
except ImportError:
    pass


def main() -> None:
    """Console-script entry: user errors become one line on stderr and exit code 2."""
    # Python's warnings (profile/card mismatch with --force, SM count) as one line each.
    previous = warnings.showwarning
    warnings.showwarning = lambda message, *_args, **_kw: err_console.print(
        f"warning: {message}", markup=False, highlight=False, soft_wrap=True)
    try:
        _run_app()
    finally:
        warnings.showwarning = previous


def _run_app() -> None:
    try:
        # Without standalone mode click returns an Exit's code instead of exiting.
        code = app(standalone_mode=False)
    except TunerError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted", markup=False)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _CLICK_ERRORS as exc:  # bad usage: click's own message, no traceback
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)
