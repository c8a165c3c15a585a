"""`tuner search` and `tuner worker`: run the Optuna search, print its summary."""

from __future__ import annotations

import re
import sys
import time
from typing import Annotated, Optional

import typer

from tuner import stop_signals
from tuner.cli.state import (
    MAX_ID,
    MAX_SEED,
    DbOption,
    SoftcapOption,
    WindowOption,
    at_most,
    console,
    err_console,
    say,
    say_wrapped,
    state,
    window_option,
)
from tuner.cli.tables import summary_table
from tuner.dtypes import names_text
from tuner.errors import TunerError
from tuner.kernels.manifest import list_templates
from tuner.models import Phase, load_model, search_plan
from tuner.reporting.profiling import profile_top
from tuner.runtime.objective import check_objective
from tuner.search.confirm import DEFAULT_CONFIRM, DEFAULT_ROUNDS
from tuner.search.confirm_run import ConfirmOptions, run_confirm
from tuner.search.early_stop import EARLY_STOP_NOISE
from tuner.search.job import MAX_REPEAT_STREAK
from tuner.search.options import SearchOptions
from tuner.search.run import SearchReport, run_join, run_search
from tuner.store import open_store


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m' -> seconds."""
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


def parse_devices(text: str) -> tuple[int, ...]:
    try:
        devices = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise TunerError(f"malformed --devices {text!r}: expected device indices such as 0,1") from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise TunerError(f"malformed --devices {text!r}: expected distinct device indices such as 0,1")
    return devices


def time_pieces(report: SearchReport) -> list[str]:
    """Where the wall time went, by phase: the search's own (preparing, summing up), then its workers'; with
    several workers (cards) their mean, since they run side by side. The GPU worker's fixed costs (inputs,
    reference, verification, baseline set-up, restarts) are named apart from the phases that waited for them.
    `other` is the rest: the sampler, the store, Python. In pieces (see say_wrapped), each with its separator;
    joined, they are time_line."""
    workers = max(report.workers, 1)
    own = [(phase, s) for phase, s in report.search_seconds]
    phases = [(phase, s / workers) for phase, s in report.seconds]
    phases.append(("other", max(report.wall_s - sum(s for _, s in own + phases), 0.0)))
    parts = [f"{phase} {s:.1f} s ({s / report.wall_s:.0%}), " for phase, s in own + phases]
    parts[-1] = parts[-1].removesuffix(", ")
    each = [f"{workers} workers, per worker (mean): "] if workers > 1 else []
    return [f"time: {report.wall_s:.1f} s wall; ", *parts[:len(own)], *each, *parts[len(own):]]


def time_line(report: SearchReport) -> str:
    """time_pieces as one line."""
    return "".join(time_pieces(report))


def count_pieces(report: SearchReport) -> list[str]:
    """What the search measured, answered, reused and pruned; its runs and studies (see say_wrapped)."""
    counts = [f"measured {report.measured} trials"]
    if report.repeated:
        counts.append(f"{report.repeated} repeated proposals answered from the store (free)")
    if report.reused:
        counts.append(f"{report.reused} reused from earlier runs")
    counts.append(f"pruned {report.infeasible} infeasible points")  # the status `tuner results` shows them with
    pieces = [f"{c}, " for c in counts[:-1]] + [f"{counts[-1]}; ", f"runs {', '.join(map(str, report.run_ids)) or '-'}; "]
    names = [f"{name}, " for name in report.studies] or ["-"]
    names[-1] = names[-1].removesuffix(", ")
    return pieces + ["studies " + names[0], *names[1:]]  # "studies" and the first name on one line


def print_search_report(report: SearchReport) -> None:
    """The summary table and one line of counts; exit 130 when the search was interrupted."""
    console.print(summary_table(report.summaries))
    # Wrapped to the terminal between phrases (they ran to 150 and 200 columns).
    say_wrapped(count_pieces(report))
    if report.wall_s and report.seconds:
        say_wrapped(time_pieces(report))
    for name, held in report.stopped_early:
        say(f"study {name}: stopped early after {held} trials (--early-stop: the best did not improve by more "
            f"than {EARLY_STOP_NOISE:.0%} in the last trials)", stderr=True)
    if report.untuned:  # stopped cleanly: what the budget left out, by problem
        labels = {s.study: s.problem.label for s in report.summaries}
        names = [f"{labels.get(name, name)}, " for name in report.untuned]
        names[-1] = names[-1].removesuffix(", ") + "; "
        say_wrapped([f"the time budget was spent: {len(report.untuned)} of {len(report.studies)} problems not "
                     "tuned: ", *names, "continue with --resume"])
    for name in report.exhausted:
        say(f"study {name}: the sampler proposed only points it already holds ({MAX_REPEAT_STREAK} in a row); "
            "the space looks exhausted for it, so the search stopped early", stderr=True)
    if report.interrupted:
        say("interrupted: every finished trial is stored; continue with --resume", stderr=True)
        # Not typer.Exit: with standalone_mode=False click returns its code instead of raising it.
        sys.exit(stop_signals.exit_code())  # 130 after Ctrl-C, 143 after SIGTERM


def search_command(
    gpu: Annotated[str, typer.Option(help="GPU profile (h100, h200, a100, l4) or auto (the GPU present).")] = "auto",
    shape: Annotated[Optional[list[str]], typer.Option(help="Problem B,H,S,D or B,H,Sq,Sk,D (repeatable); default: the profile's problems.")] = None,
    hkv: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="K/V heads (GQA/MQA); default: same as H.")] = None,
    dtype: Annotated[str, typer.Option(help=f"{names_text()}: e4m3 is FP8 q/k/v with descales (bf16 output), "
                                             "*_kv_e4m3 an FP8 KV cache (e4m3 k/v with scales; decode); a template "
                                             "that declares it.")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal", help="Causal masking.")] = False,
    layout: Annotated[str, typer.Option(help="bhsd or bshd (dense K/V), paged16 ... paged256: K/V in a paged "
                                              "cache of that page size (decode template), or packed: B sequences "
                                              "one after another, [total, H, D] with cumulative lengths "
                                              "(FlashAttention's varlen form; Sq = Sk, the longest; --lengths).")] = "bhsd",
    lengths: Annotated[str, typer.Option(help="Keys each batch row uses: full (all Sk), or uniform:LO (a ragged "
                                               "serving batch, each row's length drawn from LO..Sk, seeded; decode "
                                               "template; with --layout packed, each sequence's length).")] = "full",
    window: WindowOption = None,
    softcap: SoftcapOption = 0.0,
    template: Annotated[Optional[str], typer.Option(help="Kernel template (default: the first of the profile's templates that suits every problem; h100/h200: attn_fwd_wgmma).")] = None,
    trials: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="Feasible trials per problem (default 100; every feasible point with --sampler grid).")] = None,
    time_budget: Annotated[Optional[str], typer.Option("--time-budget", help="Stop starting trials after this long, e.g. 10m (shared by the problems).")] = None,
    sampler: Annotated[str, typer.Option(help="tpe, gp, cmaes, random or grid.")] = "tpe",
    seed: Annotated[Optional[int], typer.Option(min=0, max=MAX_SEED, help="Sampler seed.")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: <gpu>-<template>-<problem>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an existing study up to its trial budget.")] = False,
    devices: Annotated[str, typer.Option(help="GPU indices, one worker process each, e.g. 0,1.")] = "0",
    db: DbOption = None,
    top: Annotated[int, typer.Option("--profile-top", min=0, callback=at_most(MAX_ID), help="Profile the K best trials with ncu afterwards.")] = 0,
    backend: Annotated[str, typer.Option(help="gpu (measure) or replay (answer from a recorded store, see --from).")] = "gpu",
    replay_from: Annotated[Optional[str], typer.Option("--from", help="Results store URL to replay (--backend replay).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Use --gpu's profile even if the card does not match.")] = False,
    confirm: Annotated[int, typer.Option("--confirm", min=0, max=100, help="Re-time the K best variants interleaved with the baselines after each problem; the winner is the best median per-round ratio (0: off).")] = DEFAULT_CONFIRM,
    confirm_rounds: Annotated[int, typer.Option("--confirm-rounds", min=1, max=100, help="Interleaved rounds of the confirm stage.")] = DEFAULT_ROUNDS,
    model: Annotated[Optional[str], typer.Option(help="Tune the prefill and decode problems of a model, one search per layer kind (sliding window, softcap): a preset (llama-3.1-8b, llama-3.1-70b, mistral-7b, mistral-7b-v0.1, qwen2.5-7b, gemma-2-9b, gemma-3-12b) or a Hugging Face config.json (file or folder); sets the shapes, --hkv, --dtype and --causal.")] = None,
    objective: Annotated[str, typer.Option(help="What to minimize: time (µs of back-to-back calls, the card at its power limit), energy (J per call of those calls; needs NVML) or isolated (µs of calls with the card idle in between).")] = "time",
    early_stop: Annotated[Optional[int], typer.Option("--early-stop", min=1, callback=at_most(MAX_ID), help="End a problem's study when its best has not improved by more than 1% (the timing noise) for N trials; --trials stays the ceiling (default: off).")] = None,
    kernel_pass: Annotated[str, typer.Option("--pass", help="Which pass to tune: forward, backward (dQ, dK, dV from the forward's O and lse: the profile's backward templates, checked against fp32 autograd, timed against SDPA's flash and cuDNN backward and FlashAttention-4's) or both (the forward studies, then the backward ones of the same problems).")] = "forward",
    kv_cache: Annotated[str, typer.Option("--kv-cache", help="With --model: e4m3 tunes its decode steps over an FP8 KV cache (dtype <model dtype>_kv_e4m3, vLLM's k_scale / v_scale); default: the model's dtype.")] = "",
) -> None:
    """Tune kernels with Optuna: each trial is checked, compiled, measured and stored; ends with a summary."""
    # One search per phase: its shapes, window and softcap (--model: one per stage and layer kind).
    if lengths != "full" and not shape:
        raise TunerError("--lengths describes the batches of --shape problems: pass --shape (a profile's default "
                         "problems and --model's use full lengths)")
    bounds = window_option(window)
    if (bounds != (-1, -1) or softcap) and not shape:
        raise TunerError("--window and --softcap describe --shape problems: pass --shape (--model reads each layer "
                         "kind's window and softcap from the model; a profile's default problems have neither)")
    phases: list[Phase] = [Phase("search", tuple(shape or ()), bounds, softcap)]
    if model is not None:
        phases, hkv, dtype, causal = model_phases(model, kv_cache, bool(shape or hkv is not None or study))
    elif kv_cache:
        raise TunerError("--kv-cache sets the decode steps of --model; with --shape, pass the dtype itself "
                         "(--dtype bf16_kv_e4m3 or fp16_kv_e4m3)")
    kernel_pass = kernel_pass.strip().lower()
    if top and kernel_pass != "forward":
        raise TunerError("--profile-top profiles forward kernels only; run `tuner profile` on the forward's trials")
    budget = parse_duration(time_budget) if time_budget else None
    started = time.monotonic()
    for i, phase in enumerate(phases):
        # One template per search: prefill and decode problems are searched one after the other, the time
        # budget shared in proportion to their problem counts (the profile's default problems: one share).
        share = [len(p.shapes) or 1 for p in phases[i:]]
        left = None if budget is None else max(1.0, (budget - (time.monotonic() - started)) * share[0] / sum(share))
        options = SearchOptions(
            gpu=gpu, shapes=phase.shapes, heads_kv=hkv, dtype=phase.dtype or dtype, causal=causal, layout=layout,
            window=phase.window, softcap=phase.softcap,
            lengths=lengths, template=template, trials=trials, time_budget_s=left, sampler=sampler.strip().lower(), seed=seed,
            study=study, resume=resume, devices=parse_devices(devices), db_url=db or state.db_url,
            backend=backend.strip().lower(), replay_from=replay_from, force=force, confirm=confirm,
            confirm_rounds=confirm_rounds, objective=check_objective(objective), early_stop=early_stop,
            kernel_pass=kernel_pass,
        )
        # A signal while the search is prepared stops it cleanly once its workers start (nothing half-written).
        with stop_signals.deferred(lambda text: say(text, stderr=True)):
            report = run_search(options, console=err_console, hooks=state.hooks)
        if top and report.run_ids and not report.interrupted:
            with open_store(options.db_url) as store:
                for run_id in report.run_ids:
                    profile_top(store, run_id, top)
        print_search_report(report)


def model_phases(model: str, kv_cache: str, shaped: bool) -> tuple[list[Phase], int, str, bool]:
    """`--model`'s searches and the K/V heads, dtype and causality they share (`shaped`: --shape, --hkv or --study
    were passed too, which --model sets)."""
    if shaped:
        raise TunerError("--model sets the shapes, K/V heads and studies; do not pass --shape, --hkv or --study "
                         "with it")
    spec = load_model(model)
    phases = search_plan(spec, kv_cache)
    for dtype in {p.dtype for p in phases if p.dtype}:  # an FP8 cache's decode: refused before any search runs
        dims = sorted({d for m in list_templates() if dtype in m.features.dtypes for d in m.features.head_dims
                       if d % 128 == 0})  # its K/V rows are whole 128-byte swizzle boxes (attn_decode.toml)
        if spec.head_dim not in dims:
            raise TunerError(f"--kv-cache e4m3: the FP8 cache's decode kernels take head dim {' or '.join(map(str, dims))}; "
                             f"{model} has D{spec.head_dim}")
    say(f"model {spec.describe()}: {', then '.join(p.describe() for p in phases)}; each set gets its own "
        "template", stderr=True)
    return phases, spec.heads_kv, spec.dtype, True


def worker_command(
    study: Annotated[list[str], typer.Option(help="Study created by `tuner search` (repeatable).")],
    storage: Annotated[str, typer.Option(help="Optuna storage: postgresql://... or the SQLite results URL / journal file.")],
    db: Annotated[Optional[str], typer.Option("--db", help="Results store URL (default: the storage's database when PostgreSQL).")] = None,
    backend: Annotated[str, typer.Option(help="gpu or replay.")] = "gpu",
    replay_from: Annotated[Optional[str], typer.Option("--from", help="Results store URL to replay (--backend replay).")] = None,
    trials: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="Trials to run per study (default: what is left of its budget).")] = None,
    time_budget: Annotated[Optional[str], typer.Option("--time-budget", help="Stop starting trials after this long.")] = None,
    device: Annotated[int, typer.Option(min=0, max=1024, help="GPU index.")] = 0,
    seed: Annotated[Optional[int], typer.Option(min=0, max=MAX_SEED, help="Sampler seed.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replay a recording from another card than the study's profile.")] = False,
) -> None:
    """Join existing studies from this host (shared PostgreSQL storage) and work on them."""
    report = run_join(
        study, storage, db_url=db or state.db_url, backend=backend.strip().lower(), replay_from=replay_from,
        trials=trials, device=device, time_budget_s=parse_duration(time_budget) if time_budget else None,
        seed=seed, force=force, console=err_console, hooks=state.hooks,
    )
    print_search_report(report)


def confirm_command(
    gpu: Annotated[str, typer.Option(help="GPU profile (h100, h200, a100, l4) or auto (the GPU present).")] = "auto",
    shape: Annotated[Optional[list[str]], typer.Option(help="Tuned problem B,H,S,D or B,H,Sq,Sk,D (repeatable); default: every problem with ok trials.")] = None,
    confirm: Annotated[int, typer.Option("--confirm", min=1, max=100, help="Best distinct variants to re-time per problem.")] = DEFAULT_CONFIRM,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=100, help="Interleaved rounds.")] = DEFAULT_ROUNDS,
    backend: Annotated[str, typer.Option(help="gpu (measure) or replay (answer from a recorded store, see --from).")] = "gpu",
    replay_from: Annotated[Optional[str], typer.Option("--from", help="Results store URL to replay (--backend replay).")] = None,
    device: Annotated[int, typer.Option(min=0, max=1024, help="GPU index.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Use --gpu's profile even if the card does not match.")] = False,
    db: DbOption = None,
    objective: Annotated[str, typer.Option(help="What to rank by: time, energy (J per call) or isolated (see `tuner search --objective`).")] = "time",
) -> None:
    """Re-time the best stored variants of each problem interleaved with the baselines; store the confirmed winner."""
    confirmed = run_confirm(ConfirmOptions(
        gpu=gpu, shapes=tuple(shape or ()), confirm=confirm, rounds=rounds, db_url=db or state.db_url,
        backend=backend.strip().lower(), replay_from=replay_from, device=device, force=force,
        objective=check_objective(objective),
    ), say=lambda text: say(text, stderr=True), hooks=state.hooks)
    for c in confirmed:
        versus = f"{c.ratio:.3f}x {c.baseline_impl}" if c.ratio is not None else "no baseline"
        versus += "" if c.objective == "time" else f" in {c.objective}"
        say(f"{c.problem.label}: {c.variant_name} (trial {c.trial_id}) {c.median_us:.2f} µs, {versus}, "
            f"median of {c.rounds} rounds")
