"""What a C++ user of a header export does: include the template and the header, instantiate one bucket's
Config in their own kernel, and build it with nvcc (the tests skip where nvcc is missing); and a host program
around a header's nearest_bucket lookup (the tests skip where no host C++ compiler is found)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# Host-only stand-ins for the CUDA types and the Hopper template's config that a header's Config aliases name:
# HopperConfig's template parameters as attn_fwd_wgmma/config.h declares them (LEFT: the mask's left bound).
HOPPER_STUBS = (
    "struct half; struct __nv_bfloat16; struct __nv_fp8_e4m3;\n"
    "namespace fc { template <int L = -1, int R = -1, unsigned B = 0u> struct Mask { static constexpr int LEFT = L; };\n"
    "  using NoMask = Mask<>;\n"
    "  template <class T, int D, int BM, int BN, int ST, int SW, bool OV, bool PP, int PR, bool PE,\n"
    "  bool C, class M, bool P = false, bool TP = false> struct HopperConfig { static constexpr int LEFT = M::LEFT; }; }\n")


def build_host_lookup(out: Path, header: str, main: str, stubs: str = HOPPER_STUBS) -> Path:
    """main.cpp in `out` (`stubs`, the header, <cstdio>, then `main`) built with the host C++ compiler, warnings as
    errors; the program's path. Skips the test where there is no host compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    source, exe = out / "main.cpp", out / "lookup"
    source.write_text(f'{stubs}#include "{header}"\n#include <cstdio>\n{main}')
    build = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", "-O1", "-o", str(exe), str(source)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    return exe


def assert_user_kernel_builds(out: Path, template_file: str, header: str, config: str, extra: str = "") -> None:
    """user.cu in `out`: `my_attention`, an entry point of `config` (a bucket's Config), compiles to a cubin."""
    user = out / "user.cu"
    user.write_text(
        f'#include "{template_file}"\n#include "{header}"\nusing Cfg = {config};\n'
        'extern "C" __global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS) my_attention(ATTN_FWD_PARAMS)'
        f" {{ ATTN_FWD_BODY(Cfg) }}\n{extra}")
    run = subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O1", "-gencode", "arch=compute_90a,code=sm_90a",
                          "-o", str(out / "user.cubin"), str(user)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert b"my_attention" in (out / "user.cubin").read_bytes()
