"""The template compiles with the local nvcc, for sm_80 and sm_90a, across a covering sample.

Needs nvcc (no GPU). Register and spill figures from ptxas are written to
build/ptxas_report.json so a change that adds spills is visible in CI logs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuner.kernels.compiler import compile_source, parse_ptxas
from tuner.kernels.feasibility import covering_sample
from tuner.kernels.render import render
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import build_many

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)"),
]
REPORT = Path(__file__).resolve().parent.parent / "build" / "ptxas_report.json"
CASES = [(64, "fp16", False), (64, "bf16", True), (128, "fp16", True), (128, "bf16", False)]


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))  # really run nvcc, never a stale cubin


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_covering_sample_compiles(arch: str) -> None:
    profile = load_profile("a100" if arch == "sm_80" else "h100")
    variants = []
    for head_dim, dtype, causal in CASES:
        problem = Problem(1, 1, 128, 128, head_dim, dtype=dtype, causal=causal)
        variants += covering_sample("attn_fwd_mma", problem, profile, seed=head_dim)
    # Every value of every parameter, both dtypes and head dims 64 and 128 appear.
    for name in variants[0].params:
        values = {repr(v.params[name]) for v in variants}
        assert len(values) >= 2 or name == "Q_IN_REGS", (name, values)
    results = [b.compiled for b in build_many(variants, arch, workers=2)]
    failures = [f"{v.name}:\n{r.log[-1500:]}" for v, r in zip(variants, results) if not r.ok]
    assert not failures, "\n".join(failures)
    figures = {v.name: {"registers": r.registers, "spill_bytes": r.spill_bytes, "compile_s": round(r.seconds, 2)}
               for v, r in zip(variants, results)}
    assert all(0 < f["registers"] <= 255 for f in figures.values())
    REPORT.parent.mkdir(exist_ok=True)
    existing = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    existing[arch] = figures
    REPORT.write_text(json.dumps(existing, indent=1, sort_keys=True))


def test_compile_error_is_a_result_with_the_log() -> None:
    res = compile_source("this is not CUDA;", "broken_kernel", "sm_80")
    assert not res.ok and res.cubin_path is None
    assert "error" in res.log and "tuner-nvcc/" not in res.log


def test_cache_serves_the_same_cubin() -> None:
    src = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] = 1.0f; }\n'
    first = compile_source(src, "tiny", "sm_80")
    second = compile_source(src, "tiny", "sm_80")
    assert first.ok and not first.cached and second.cached
    assert first.cubin_sha256 == second.cubin_sha256 and second.cubin == first.cubin


def test_ptxas_report_parsing() -> None:
    log = (
        "ptxas info    : Compiling entry function 'other' for 'sm_90a'\n"
        "ptxas info    : Used 40 registers\n"
        "ptxas info    : Compiling entry function 'mine' for 'sm_90a'\n"
        "ptxas info    : Function properties for mine\n"
        "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 16 bytes cumulative stack size\n"
    )
    assert parse_ptxas(log, "mine") == {"registers": 255, "spill_bytes": 20, "stack_bytes": 16, "static_smem_bytes": 1024}


@pytest.mark.parametrize(
    "name",
    [
        "attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg",    # FlashAttention-2's D64 shape
        "attn_fwd_mma_d128_fp16_m128n32_w4_q_rows_pad_s3_qsmem_b2",
        "attn_fwd_mma_d64_bf16_m128n128_w8_q_rows_xor_s2_qsmem_causal",
    ],
)
def test_winning_shapes_keep_everything_in_registers(name: str) -> None:
    # A register array indexed at run time lands in local memory (stack frame)
    # and cost 4x on an H200 once; the tuned shapes must compile without it.
    from tuner.kernels.variant import parse_variant_name

    variant = parse_variant_name(name)
    res = compile_source(render(variant), name, "sm_90a")
    assert res.ok
    assert res.stack_bytes == 0 and res.spill_bytes == 0, (res.registers, res.spill_bytes, res.stack_bytes)


def test_same_source_gives_the_same_cubin_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Export compares cubin hashes with the ones the search stored; that only
    # works if nvcc output does not depend on the (private, random) build folder.
    src = 'extern "C" __global__ void tiny2(float* x) { x[threadIdx.x] = 2.0f; }\n'
    first = compile_source(src, "tiny2", "sm_80", use_cache=False)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "other-cache"))
    second = compile_source(src, "tiny2", "sm_80", use_cache=False)
    assert first.ok and second.ok and first.cubin_sha256 == second.cubin_sha256


def test_nvcc_builds_in_a_private_folder_not_a_shared_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path another user could plant under /tmp (a symlink to their folder) is never written through."""
    shared_tmp = tmp_path / "tmp"
    planted = tmp_path / "attacker"
    shared_tmp.mkdir()
    planted.mkdir()
    (shared_tmp / "tuner-nvcc").symlink_to(planted)
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    src = 'extern "C" __global__ void tiny3(float* x) { x[threadIdx.x] = 3.0f; }\n'
    assert compile_source(src, "tiny3", "sm_80", use_cache=False).ok
    assert list(planted.iterdir()) == []
    build_root = tmp_path / "cache" / "build"  # beside the cubin cache, the user's own
    assert build_root.is_dir() and (build_root.stat().st_mode & 0o077) == 0 and list(build_root.iterdir()) == []


def test_lineinfo_builds_keep_the_machine_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling builds with -lineinfo (ncu's source view): another cache entry, the same .text."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    src = 'extern "C" __global__ void tiny4(float* x) { x[threadIdx.x] = 4.0f; }\n'
    plain, lined = compile_source(src, "tiny4", "sm_80"), compile_source(src, "tiny4", "sm_80", lineinfo=True)
    assert plain.ok and lined.ok and plain.cubin_path != lined.cubin_path
    assert plain.registers == lined.registers
