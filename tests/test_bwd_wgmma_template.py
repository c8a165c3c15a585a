"""The Hopper wgmma backward template (attn_bwd_wgmma) without a GPU: its manifest (pass = "backward", sm_90a
only), its three rendered entry points, variant names, feasibility (no windows, softcap or head dim 32 in this
version), nvcc builds of every feasible point at D64 and D128 without spills, and its SASS (wgmma, dQ by
reductions). Its GPU test is tests/gpu/test_bwd_wgmma_kernel.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kernel_builds import needs_nvcc
from tuner.kernels.feasibility import check, enumerate_space, feasible_space, resources, supports_problem
from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import render
from tuner.kernels.variant import Variant, parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import build_many

TEMPLATE = "attn_bwd_wgmma"
NAME = "attn_bwd_wgmma_d128_bf16_m64n128_s2_causal"


def _problem(head_dim: int, dtype: str = "bf16", causal: bool = False, **kw) -> Problem:
    return Problem(1, 8, 512, 512, head_dim, dtype=dtype, causal=causal, **kw)


def test_the_manifest_declares_a_backward_for_sm90a_only() -> None:
    manifest = load_manifest(TEMPLATE)
    assert manifest.kernel_pass == "backward" and manifest.aux_entries == ("dot_do_o", "dq_convert")
    assert list(manifest.archs) == ["sm_90a"]
    # The launcher's parameter list and row kernels are the sm_80 template's.
    assert {"attn_bwd_mma/args.h", "attn_bwd_mma/rows.h", "attn_fwd_wgmma/wgmma_generated.h"} <= set(manifest.files)


def test_render_writes_the_three_entry_points() -> None:
    source = render(parse_variant_name(NAME))
    entries = re.findall(r'^extern "C" __global__ void __launch_bounds__\((\S+?)(?:, \S+)?\)\n(\w+)\(ATTN_BWD_PARAMS\)',
                         source, re.MULTILINE)
    assert entries == [("TunerCfg::THREADS", NAME), ("TunerCfg::AUX_THREADS", f"{NAME}_dot_do_o"),
                       ("TunerCfg::AUX_THREADS", f"{NAME}_dq_convert")]
    assert "fc::BwdWgmmaConfig<__nv_bfloat16, 128, 64, 128, 2, false, false, false, true>" in source


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_variant_name_round_trips(head_dim: int) -> None:
    for causal in (False, True):
        for v in enumerate_space(TEMPLATE, _problem(head_dim, "fp16", causal)):
            assert parse_variant_name(v.name) == v and v.name.startswith(f"{TEMPLATE}_d{head_dim}_fp16_m")


@pytest.mark.parametrize("kw, reason", [
    ({"window_left": 100}, "no sliding windows"),
    ({"softcap": 30.0}, "no logit softcapping"),
])
def test_windows_and_softcap_are_not_supported_yet(kw: dict, reason: str) -> None:
    assert reason in supports_problem(load_manifest(TEMPLATE), _problem(64, causal=True, **kw))


def test_head_dim_32_is_not_supported() -> None:
    assert "head dim 32" in supports_problem(load_manifest(TEMPLATE), _problem(32))


@pytest.mark.parametrize("params, head_dim, reason", [
    ({"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": False, "PRODUCER": False, "DQ_WRITER": False}, 128, "192 fp32 registers"),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": True, "PRODUCER": False, "DQ_WRITER": False}, 64, ""),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": True, "PRODUCER": False, "DQ_WRITER": False}, 128, ""),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": False, "PRODUCER": False, "DQ_WRITER": False}, 64, "shared evenly by the BLOCK_N / 64 warpgroups"),
    ({"BLOCK_M": 64, "BLOCK_N": 64, "STAGES": 2, "DQ_BULK": True, "PRODUCER": False, "DQ_WRITER": False}, 128, "one dQ block per warpgroup"),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 3, "DQ_BULK": False, "PRODUCER": False, "DQ_WRITER": False}, 128, "3 takes a producer"),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 3, "DQ_BULK": False, "PRODUCER": True, "DQ_WRITER": False}, 128, ""),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": False, "PRODUCER": True, "DQ_WRITER": False}, 64, "BLOCK_M 128 spills"),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 3, "DQ_BULK": False, "PRODUCER": False, "DQ_WRITER": True}, 128,
     "the dQ writer is a warp of the producer warpgroup"),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": True, "PRODUCER": True, "DQ_WRITER": True}, 128, ""),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": False, "PRODUCER": True, "DQ_WRITER": True}, 128, ""),
    ({"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 3, "DQ_BULK": False, "PRODUCER": True, "DQ_WRITER": True}, 128,
     "exceeds h100's 232448 B"),
])
def test_feasibility_rejects_what_the_kernel_cannot_take(params: dict, head_dim: int, reason: str) -> None:
    verdict = check(Variant(TEMPLATE, head_dim, "bf16", True, params), _problem(head_dim, causal=True),
                    load_profile("h100"))
    assert bool(verdict) == (not reason) and reason in verdict.reason


_BM80 = {"BLOCK_M": 80, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": True, "PRODUCER": True, "DQ_WRITER": True}


@pytest.mark.parametrize("change, head_dim, causal, reason", [
    ({}, 128, False, ""),
    ({}, 128, True, ""),  # causal too, since session 27 (its loop compiles without spills)
    ({}, 64, False, "BLOCK_M 80 computes dQ^T"),
    ({"DQ_BULK": False}, 128, False, "BLOCK_M 80 computes dQ^T"),
    ({"STAGES": 3}, 128, False, "BLOCK_M 80 computes dQ^T"),
    ({"BLOCK_N": 64}, 128, False, "BLOCK_M 80 computes dQ^T"),
])
def test_block_m_80_is_feasible_only_with_the_tiled_writer_at_d128(change: dict, head_dim: int, causal: bool,
                                                                  reason: str) -> None:
    verdict = check(Variant(TEMPLATE, head_dim, "bf16", causal, {**_BM80, **change}),
                    _problem(head_dim, causal=causal), load_profile("h100"))
    assert bool(verdict) == (not reason) and reason in verdict.reason


def test_block_m_80_pads_rows_to_its_tile() -> None:
    """lse / delta rows and the tiled dq_accum padded to whole 80-row tiles (its bulk loads and blocks never cross
    a head); 224 KB of shared memory plus the 1 KB alignment slack."""
    res = resources(Variant(TEMPLATE, 128, "bf16", False, _BM80))
    assert (res["lse_row_pad"], res["tma_rows"], res["dq_tiled"], res["threads"]) == (80, 80, 1, 384)
    assert res["smem_bytes"] == 1024 + 229376 + 1280 + 32


def test_only_hopper_builds_it() -> None:
    variant = Variant(TEMPLATE, 64, "bf16", False, {"BLOCK_M": 64, "BLOCK_N": 128, "STAGES": 2, "DQ_BULK": False, "PRODUCER": False, "DQ_WRITER": False})
    assert "compute capability 9.0" in check(variant, _problem(64), load_profile("a100")).reason
    # D64: every tiling but BLOCK_M 64 with BLOCK_N 128 (one dQ block for two warpgroups), in 1 or 2 stages, with
    # register reductions (3 x 2), and in bulk where each warpgroup has one dQ block (m64n64, m128n128: 2 x 2);
    # with a producer warpgroup (1 to 3 ring slots) all but m128n128 (two consumers at 240 registers): m128n64 x 3,
    # m64n64 x 3 x 4 (register, bulk, writer or tiled writer reductions)
    assert len(feasible_space(TEMPLATE, _problem(64), load_profile("h100"))) == 25


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_feasible_point_compiles_without_spills(head_dim: int) -> None:
    profile = load_profile("h100")
    variants = [v for causal in (False, True) for dtype in ("bf16", "fp16")
                for v in feasible_space(TEMPLATE, _problem(head_dim, dtype, causal), profile)]
    results = [b.compiled for b in build_many(variants, "sm_90a", workers=2)]
    failures = [f"{v.name}:\n{r.log[-1500:]}" for v, r in zip(variants, results) if not r.ok]
    assert not failures, "\n".join(failures)
    bad = [(r.entry, r.registers, r.spill_bytes) for r in results if not (0 < r.registers <= 255 and r.spill_bytes == 0)]
    assert not bad, bad
    # ptxas keeps the wgmmas asynchronous (it says so when it has to serialise them).
    assert not [r.entry for r in results if "serialized" in r.log]


@pytest.mark.nvcc
@needs_nvcc
def test_the_sass_has_wgmma_and_dq_reductions(tmp_path: Path) -> None:
    """wgmma compiled to HGMMA (per tile at D128, BM64: S^T, dP^T and dQ 8 64x64 steps each, dV and dK 4 64x128
    each, in each of the consumer's two loops: a head's partial tiles and its whole ones); atomicAdd whose result is
    unused compiles to a reduction (REDG on sm_90), never a returning ATOM."""
    from tests.kernel_builds import sass
    from tuner.kernels.sass_budget import functions, main_loop

    res = build_many([parse_variant_name(NAME)], "sm_90a")[0].compiled
    assert res.ok, res.log[-2000:]
    code = sass(res.cubin, tmp_path)
    main = code.split(f"Function : {NAME}\n")[1].split("Function :")[0]
    assert main.count("HGMMA.64x64x16.F32.BF16") == 2 * 24 and main.count("HGMMA.64x128x16.F32.BF16") == 2 * 8
    loop = main_loop(code, NAME)
    tile = " ".join(i.text for i in functions(code)[NAME] if loop.start <= i.addr <= loop.end)
    assert tile.count("HGMMA.64x64x16.F32.BF16") == 24 and tile.count("HGMMA.64x128x16.F32.BF16") == 8
    assert "REDG.E.ADD.F32" in main and "ATOM" not in main
