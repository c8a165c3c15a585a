"""The sm_80 backward template (attn_bwd_mma) without a GPU: its manifest (pass = "backward"), its three rendered
entry points, the launcher's parameter format against the template's list, feasibility, and nvcc builds of a
covering sample for sm_80 and sm_90a (registers and spills of the main kernel reported to build/ptxas_report.json).
Its GPU test is tests/gpu/test_bwd_mma_kernel.py."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from tests.kernel_builds import needs_nvcc
from tuner.errors import TunerError
from tuner.kernels.feasibility import check, covering_sample
from tuner.kernels.manifest import list_templates, load_manifest, load_manifest_file
from tuner.kernels.render import render
from tuner.kernels.variant import Variant, parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.backward_launch import ARG_FORMAT
from tuner.runtime.build import build_many

TEMPLATE = "attn_bwd_mma"
REPORT = Path(__file__).resolve().parent.parent / "build" / "ptxas_report.json"
ARGS_H = Path(__file__).resolve().parent.parent / "kernel_templates" / "attn_bwd_mma" / "args.h"
NAME = "attn_bwd_mma_d128_bf16_m64n128_w8_xor_s2_causal"


def test_the_manifest_declares_a_backward_and_the_forwards_stay_forwards() -> None:
    manifest = load_manifest(TEMPLATE)
    assert manifest.kernel_pass == "backward" and manifest.aux_entries == ("dot_do_o", "dq_convert")
    others = [m for m in list_templates() if m.name != TEMPLATE and not m.name.startswith("attn_bwd")]
    assert others and all(m.kernel_pass == "forward" and m.aux_entries == () for m in others)


def test_a_pass_other_than_forward_or_backward_is_refused(tmp_path: Path) -> None:
    src = load_manifest(TEMPLATE).source_path
    text = (src.parent / f"{TEMPLATE}.toml").read_text().replace('pass = "backward"', 'pass = "sideways"')
    (tmp_path / f"{TEMPLATE}.toml").write_text(text)
    (tmp_path / src.name).write_text(src.read_text())
    with pytest.raises(TunerError, match="pass must be one of forward, backward"):
        load_manifest_file(tmp_path / f"{TEMPLATE}.toml")


def test_render_writes_the_three_entry_points() -> None:
    source = render(parse_variant_name(NAME))
    entries = re.findall(r'^extern "C" __global__ void __launch_bounds__\((\S+?)(?:, \S+)?\)\n(\w+)\(ATTN_BWD_PARAMS\)',
                         source, re.MULTILINE)
    assert entries == [("TunerCfg::THREADS", NAME), ("TunerCfg::AUX_THREADS", f"{NAME}_dot_do_o"),
                       ("TunerCfg::AUX_THREADS", f"{NAME}_dq_convert")]
    assert "static_assert(TunerCfg::AUX_ROWS == 8," in source and "ATTN_FWD_PARAMS" not in source.split("using TunerCfg")[1]


def test_a_forward_renders_one_entry_point() -> None:
    source = render(parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg"))
    assert len(re.findall(r'^extern "C"', source, re.MULTILINE)) == 1 and "ATTN_BWD" not in source


def test_the_launchers_format_is_the_templates_parameter_list() -> None:
    """ARG_FORMAT packs ATTN_BWD_PARAMS_LIST (args.h) positionally: the same kinds in the same order (the wgmma
    template prepends its two tensor maps: backward_launch._tma_format)."""
    macro = re.search(r"#define ATTN_BWD_PARAMS_LIST(.*?)\n\n", ARGS_H.read_text(), re.DOTALL).group(1)
    kinds = {"const void *": "P", "void *": "P", "const float *": "P", "float *": "P", "long long": "q",
             "int": "i", "float": "f"}
    params = [p.strip() for p in macro.replace("\\", "").split(",")]
    spelled = "".join(next(code for kind, code in kinds.items() if p.startswith(kind)) for p in params)
    assert spelled == ARG_FORMAT and struct.calcsize(ARG_FORMAT) == 12 * 8 + 24 * 8 + 4 * 4 + 4


def _problem(head_dim: int, dtype: str, causal: bool, **kw) -> Problem:
    return Problem(1, 8, 512, 512, head_dim, dtype=dtype, causal=causal, **kw)


@pytest.mark.parametrize("params, reason", [
    ({"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 8, "SWIZZLE": "xor", "STAGES": 2}, "XOR swizzle"),
    ({"BLOCK_M": 64, "BLOCK_N": 32, "NUM_WARPS": 4, "SWIZZLE": "pad", "STAGES": 2}, "multiple of 16 keys"),
    ({"BLOCK_M": 128, "BLOCK_N": 128, "NUM_WARPS": 4, "SWIZZLE": "xor", "STAGES": 2}, "192 fp32 registers"),
    ({"BLOCK_M": 32, "BLOCK_N": 128, "NUM_WARPS": 8, "SWIZZLE": "pad", "STAGES": 1}, ""),
])
def test_feasibility_rejects_what_the_kernel_cannot_take(params: dict, reason: str) -> None:
    problem = _problem(128, "bf16", True)
    verdict = check(Variant(TEMPLATE, 128, "bf16", True, params), problem, load_profile("a100"))
    assert bool(verdict) == (not reason) and reason in verdict.reason


def test_shared_memory_of_the_largest_tiles_is_checked_against_the_card() -> None:
    params = {"BLOCK_M": 64, "BLOCK_N": 128, "NUM_WARPS": 8, "SWIZZLE": "pad", "STAGES": 2}
    variant = Variant(TEMPLATE, 128, "fp16", False, params)
    assert check(variant, _problem(128, "fp16", False), load_profile("a100"))  # 158720 B < 163 KiB
    assert "shared memory" in check(variant, _problem(128, "fp16", False), load_profile("l4")).reason  # 99 KiB


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))  # really run nvcc, never a stale cubin


CASES = [(64, "fp16", False, {}), (128, "bf16", True, {}), (64, "bf16", True, {"window_left": 100, "softcap": 30.0})]
CLEAN = ["attn_bwd_mma_d128_bf16_m64n128_w8_pad_s2", "attn_bwd_mma_d64_fp16_m64n128_w8_xor_s2"]


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_covering_sample_compiles(arch: str, fresh_cache: None) -> None:
    profile = load_profile("a100" if arch == "sm_80" else "h100")
    variants = [parse_variant_name(name) for name in CLEAN]
    for head_dim, dtype, causal, mask in CASES:
        variants += covering_sample(TEMPLATE, _problem(head_dim, dtype, causal, **mask), profile, seed=head_dim)[:3]
    results = [b.compiled for b in build_many(variants, arch, workers=2)]
    failures = [f"{v.name}:\n{r.log[-1500:]}" for v, r in zip(variants, results) if not r.ok]
    assert not failures, "\n".join(failures)
    # The main kernel's figures (compile_source reports the entry named after the variant, not the row kernels).
    assert all(0 < r.registers <= 255 and f"Compiling entry function '{v.name}_dot_do_o'" in r.log
               for v, r in zip(variants, results))
    assert all(r.spill_bytes == 0 for r in results[: len(CLEAN)]), [(r.entry, r.spill_bytes) for r in results]
    REPORT.parent.mkdir(exist_ok=True)
    existing = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    existing[f"{TEMPLATE}_{arch}"] = {v.name: {"registers": r.registers, "spill_bytes": r.spill_bytes}
                                      for v, r in zip(variants, results)}
    REPORT.write_text(json.dumps(existing, indent=1, sort_keys=True))


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not on PATH")
@needs_nvcc
def test_dq_is_accumulated_with_reductions_not_returning_atomics(fresh_cache: None, tmp_path: Path) -> None:
    """atomicAdd whose result is unused compiles to RED (red.global.add.f32), never a returning ATOM."""
    from tests.kernel_builds import sass

    res = build_many([parse_variant_name(CLEAN[1])], "sm_80")[0].compiled
    assert res.ok, res.log[-2000:]
    code = sass(res.cubin, tmp_path)
    main = code.split(f"Function : {CLEAN[1]}\n")[1].split("Function :")[0]
    assert "RED.E.ADD.F32" in main and "ATOM" not in main


RANGE_CHECK = r"""
#include <cstdio>
#include "attn_bwd_mma/tile.h"

// Every query row that sees a key of a block lies in the block's query_range (else its dK/dV and dQ terms would
// be lost); printed: rows missed, and rows in the range that see none of the block's keys (work wasted).
template <int L, int R, bool CAUSAL>
void check(int sq, int sk, int bn) {
  using K = fc::KeyWindow<fc::Mask<L, R, 0u>, CAUSAL>;
  long long missed = 0, wasted = 0;
  for (int n0 = 0; n0 < sk; n0 += bn) {
    const int n1 = n0 + bn < sk ? n0 + bn : sk;
    const int2 rows = fc::query_range<K, CAUSAL>(n0, n1, sk - sq, sq);
    for (int i = 0; i < sq; ++i) {
      bool sees = false;
      for (int j = n0; j < n1; ++j) sees |= !K::hidden(j, i + sk - sq, sk);
      const bool in = rows.x <= i && i < rows.y;
      missed += sees && !in;
      wasted += in && !sees;
    }
  }
  std::printf("%d %d %d %d %d %d %lld %lld\n", L, R, CAUSAL ? 1 : 0, sq, sk, bn, missed, wasted);
}

int main() {
  const int shapes[][2] = {{1, 1}, {7, 7}, {64, 64}, {100, 300}, {300, 100}, {257, 257}, {513, 700}, {90, 1}};
  for (const auto& s : shapes)
    for (int bn : {32, 64, 128}) {
      check<-1, -1, false>(s[0], s[1], bn);
      check<-1, -1, true>(s[0], s[1], bn);
      check<0, -1, true>(s[0], s[1], bn);
      check<37, -1, true>(s[0], s[1], bn);
      check<5, 3, false>(s[0], s[1], bn);
      check<0, 0, false>(s[0], s[1], bn);
      check<-1, 4, false>(s[0], s[1], bn);
      check<20, -1, false>(s[0], s[1], bn);
      check<130, 0, false>(s[0], s[1], bn);
    }
}
"""


@pytest.mark.nvcc
@needs_nvcc
def test_the_query_range_of_a_key_block_holds_every_row_that_sees_it(tmp_path: Path) -> None:
    import subprocess

    from tuner.kernels.manifest import template_folders

    src = tmp_path / "range_check.cu"
    src.write_text(RANGE_CHECK)
    exe = tmp_path / "range_check"
    subprocess.run(["nvcc", "-std=c++17", "-o", str(exe), str(src), "-I", str(template_folders()[0])], check=True,
                   capture_output=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    rows = [list(map(int, line.split())) for line in lines if line]
    assert len(rows) == 8 * 3 * 9
    assert all(r[6] == 0 for r in rows), [r for r in rows if r[6]][:5]
    # Bounded on both sides where the mask is: no row range wider than the rows the block's keys can reach.
    assert all(r[7] <= 2 * r[5] for r in rows if r[0] >= 0 and (r[2] or r[1] >= 0)), [r for r in rows if r[7] > 2 * r[5]][:5]
