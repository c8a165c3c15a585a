"""Where the softmax's exp2s sit against the P·V wait in a variant's SASS (issue 27, KERNEL_NOTES §1).

With OVERLAP, tile j's MUFU.EX2 are meant to run while the tensor cores compute P_{j-1} V_{j-1}; ptxas may
hoist the wgmma wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) above them. Prints, per main-loop copy, how many
MUFU.EX2 sit between the wait for S_j (DEPBAR 0x1) and the P·V wait, and how many after it. No GPU:
nvcc, and nvdisasm from PATH or the nvidia-cuda-nvdisasm wheel.

    python benchmarks/sass_overlap.py attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp [...]
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.kernels.variant import parse_variant_name
from tuner.runtime.build import build

_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?);")


def nvdisasm() -> str | None:
    """nvdisasm on PATH, else the one of the nvidia-cuda-nvdisasm wheel (a test dependency)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(candidate)
    return None


def exp2_before_pv_wait(sass: str) -> list[tuple[int, int]]:
    """Per main-loop copy: (MUFU.EX2 between the S wait and the P·V wait, MUFU.EX2 after the P·V wait up to
    the next wgmma). A copy starts at each `WARPGROUP.DEPBAR.LE gsb0, 0x1`."""
    ops = [m.group(1) for m in _INSTRUCTION.finditer(sass)]
    copies, i = [], 0
    while i < len(ops):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in ops[i]:
            i += 1
            continue
        j = i + 1
        while j < len(ops) and "WARPGROUP.DEPBAR.LE gsb0, 0x0" not in ops[j]:
            j += 1
        k = j + 1
        while k < len(ops) and "HGMMA" not in ops[k] and "DEPBAR.LE gsb0, 0x1" not in ops[k]:
            k += 1
        copies.append((sum("MUFU.EX2" in op for op in ops[i:j]), sum("MUFU.EX2" in op for op in ops[j:k])))
        i = k
    return copies



def main() -> None:
    tool = nvdisasm()
    if tool is None:
        raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[1:]:
            built = build(parse_variant_name(name), "sm_90a")
            path = Path(tmp) / f"{name}.cubin"
            path.write_bytes(built.compiled.cubin)
            sass = subprocess.run([tool, str(path)], capture_output=True, text=True, check=True).stdout
            print(f"{name}: (exp2 before, after the P.V wait) per loop copy {exp2_before_pv_wait(sass)}")


if __name__ == "__main__":
    main()
