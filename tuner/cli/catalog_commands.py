"""`tuner profiles`, `tuner space`, `tuner render`: what the tool knows, without a GPU (render reads the
store for a trial id or a short variant name)."""

from __future__ import annotations

import json
from collections import Counter
from enum import Enum
from typing import Annotated, Optional

import typer

from tuner.cli.state import (
    MAX_ID,
    DbOption,
    SoftcapOption,
    WindowOption,
    at_most,
    console,
    output_format,
    say,
    state,
    use_db,
    window_option,
)
from tuner.cli.tables import profiles_table, space_table
from tuner.cli.variant_lookup import NameHints, resolve_render_target
from tuner.dtypes import names_text
from tuner.errors import TunerError
from tuner.kernels.feasibility import Feasibility, default_template, space_report
from tuner.kernels.render import render_standalone
from tuner.kernels.variant import Variant
from tuner.problem import problem_from_shape
from tuner.profiles import list_profiles, offline_profile


class ProfilesFormat(str, Enum):
    table = "table"
    json = "json"


def profiles_command(
    fmt: Annotated[
        ProfilesFormat,
        typer.Option("--format", help="table (default) or json (every field of every profile)."),
    ] = ProfilesFormat.table,
) -> None:
    """List the GPU profiles shipped with the tuner (works without a GPU)."""
    profiles = list_profiles()
    if fmt is ProfilesFormat.json:
        typer.echo(json.dumps([p.to_dict() for p in profiles], indent=2))
        return
    console.print(profiles_table(profiles))


def space_command(
    gpu: Annotated[str, typer.Option(help="GPU profile name (h100, h200, a100, l4) or auto.")],
    shape: Annotated[str, typer.Option(help="Problem shape B,H,S,D or B,H,Sq,Sk,D.")],
    dtype: Annotated[str, typer.Option(help=f"{names_text()} (e4m3: FP8 q, k, v; *_kv_e4m3: an FP8 KV cache).")] = "fp16",
    causal: Annotated[bool, typer.Option("--causal", help="Causal masking.")] = False,
    hkv: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="K/V heads (GQA); default: same as heads.")] = None,
    layout: Annotated[str, typer.Option(help="bhsd, bshd, paged16 ... paged256 (a paged K/V cache), or packed (varlen sequences).")] = "bhsd",
    lengths: Annotated[str, typer.Option(help="Keys each batch row uses: full, or uniform:LO (a ragged batch; packed: each sequence's length).")] = "full",
    window: WindowOption = None,
    softcap: SoftcapOption = 0.0,
    template: Annotated[Optional[str], typer.Option(help="Kernel template name (default: the profile's first that suits the problem).")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list infeasible variants with the reason.")] = False,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """List the variants of a template that fit a problem on a GPU (no GPU needed)."""
    fmt = output_format(fmt, ("table", "json"))
    profile = offline_profile(gpu)
    problem = problem_from_shape(shape, dtype=dtype, causal=causal, heads_kv=hkv, layout=layout, lengths=lengths,
                                 window=window_option(window), softcap=softcap)
    template = template or default_template(profile, [problem])
    report = space_report(template, problem, profile)
    if not show_all and not any(f.ok for _, f in report):
        raise TunerError(f"no variant of {template} fits {problem.label} on {profile.name}; "
                         f"the commonest reasons: {commonest_reasons(report)} (--all lists every variant)")
    rows = [(v, f) for v, f in report if f.ok or show_all]
    if fmt == "json":
        typer.echo(json.dumps([{**v.to_dict(), "feasible": f.ok, "reason": f.reason or None,
                                "smem_bytes": f.smem_bytes, "threads": f.threads} for v, f in rows], indent=2))
        return
    console.print(space_table(template, profile, problem, rows, show_all))


def commonest_reasons(report: list[tuple[Variant, Feasibility]], k: int = 3) -> str:
    """The k most frequent infeasibility reasons, with how many variants each rules out."""
    counts = Counter(f.reason for _, f in report if not f.ok)
    return "; ".join(f"{reason} ({n} of {len(report)})" for reason, n in counts.most_common(k))


def render_command(
    variant: Annotated[str, typer.Argument(help=(
        "A trial id, a variant name (e.g. attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg), or its "
        "tunables part as `tuner results` and the search summary print it (m128n64_w4_q_rows_xor_s2_qreg)."))],
    gpu: Annotated[Optional[str], typer.Option(help=(
        "GPU profile whose arch the nvcc command names (default: the trial's card, else the template's "
        "first arch); with a tunables part, only trials on it resolve the name."))] = None,
    template: Annotated[Optional[str], typer.Option(help="With a tunables part: the kernel template.")] = None,
    head_dim: Annotated[Optional[int], typer.Option(min=1, callback=at_most(MAX_ID), help="With a tunables part: the head dim.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help=f"With a tunables part: {names_text()}.")] = None,
    db: DbOption = None,
) -> None:
    """Print the CUDA source of one variant as one file nvcc compiles alone (its headers inlined);
    its first lines give the nvcc command. A tunables part is completed from the options, else from
    the stored trials that have it."""
    use_db(db)
    target = resolve_render_target(variant, NameHints(gpu, template, head_dim, dtype), state.db_url)
    if target.warning:
        say(f"warning: {target.warning}", stderr=True)
    typer.echo(render_standalone(target.variant, target.arch), nl=False)
