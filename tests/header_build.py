"""What a C++ user of a header export does: include the template and the header, instantiate one bucket's
Config in their own kernel, and build it with nvcc (the tests skip where nvcc is missing)."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
