"""Generate the wgmma wrappers of kernel_templates/attn_fwd_wgmma.cu.

A wgmma instruction names every accumulator register as its own asm operand
(N/2 of them for m64nNk16), which C++ cannot spell with a loop. This script
writes one specialisation per N between the GENERATED markers of the
template; tests/test_wgmma_template.py fails when the file and this script
disagree. Run: python tools/gen_wgmma_wrappers.py
"""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "kernel_templates" / "attn_fwd_wgmma.cu"
BEGIN = "// ---- BEGIN GENERATED wgmma wrappers (tools/gen_wgmma_wrappers.py; do not edit)\n"
END = "// ---- END GENERATED wgmma wrappers\n"
WIDTHS = (64, 80, 96, 112, 128, 144, 160, 176, 192)
TYPES = (("false", "f16"), ("true", "bf16"))


def _regs(first: int, count: int) -> str:
    return ", ".join(f"%{i}" for i in range(first, first + count))


def _outputs(count: int) -> str:
    rows = [", ".join(f'"+f"(d[{i}])' for i in range(r, min(r + 8, count))) for r in range(0, count, 8)]
    return (",\n" + " " * 14).join(rows)


def _specialisation(n: int) -> str:
    acc = n // 2
    out = _outputs(acc)
    lines = [f"template <>\nstruct Wgmma<{n}> {{"]
    # A and B from shared memory (descriptors); B K-major (Q K^T) or MN-major (P V from smem).
    lines.append("  template <bool BF16, int TRANS_B>")
    lines.append("  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {")
    for is_bf16, ab in TYPES:
        lines.append(f"    if constexpr (BF16 == {is_bf16})")
        lines.append(
            f'      asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 2}, 0;\\n"\n'
            f'                   "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{_regs(0, acc)}}}, "\n'
            f'                   "%{acc}, %{acc + 1}, p, 1, 1, 0, %{acc + 3};\\n}}\\n"\n'
            f"          : {out}\n"
            f'          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));')
    lines.append("  }")
    # A from registers (P), B from shared memory MN-major (V).
    lines.append("  template <bool BF16>")
    lines.append("  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {")
    for is_bf16, ab in TYPES:
        lines.append(f"    if constexpr (BF16 == {is_bf16})")
        lines.append(
            f'      asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{acc + 5}, 0;\\n"\n'
            f'                   "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{_regs(0, acc)}}}, "\n'
            f'                   "{{%{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}, %{acc + 4}, p, 1, 1, 1;\\n}}\\n"\n'
            f"          : {out}\n"
            f'          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));')
    lines.append("  }")
    lines.append("};")
    return "\n".join(lines) + "\n"


def generate() -> str:
    body = "template <int N>\nstruct Wgmma;  // m64nNk16, fp32 accumulators d[N/2] in the wgmma fragment order\n"
    return BEGIN + body + "".join(_specialisation(n) for n in WIDTHS) + END


def splice(source: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(source):
        raise SystemExit(f"{TEMPLATE}: GENERATED markers not found")
    return pattern.sub(lambda _: generate(), source)


if __name__ == "__main__":
    TEMPLATE.write_text(splice(TEMPLATE.read_text()))
    print(f"wrote wgmma wrappers for N in {WIDTHS} into {TEMPLATE}")
