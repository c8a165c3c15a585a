"""The Hopper backward's consumer loop counted in static SASS, per query tile, for a list of variants (issue 40).

For each variant (this checkout's build, or <variant>.cubin from folders that build_cubins.py filled from other
revisions) prints one row per label: the consumer loop's instructions a tile (tuner/kernels/sass_budget.py's
main_loop: the shortest loop with wgmmas, from its head to its back branch), what every tile runs (less the
blocks under a predicated forward branch: a partial tile's mask), those blocks, R2UR and YIELD in the loop, the
kernel's instructions, registers and spill bytes; with --ops, the loop by opcode side by side. No GPU needed;
nvcc and cuobjdump (export PATH=<venv>/lib/python3.11/site-packages/nvidia/cu13/bin:$PATH).

Variants outside the manifest's constraints render and compile too (the template's static_asserts still hold):
e.g. attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw_causal before its constraint was lifted.

    python benchmarks/bwd_loop_count.py VARIANT [VARIANT ...]
    python benchmarks/bwd_loop_count.py --cubins main=.ab/main --ops VARIANT ...   # main's beside this checkout
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tuner.kernels.compiler import compile_source
from tuner.kernels.render import render
from tuner.kernels.sass_budget import TENSOR_OPS, LoopBudget, cubin_sass, cuobjdump, functions, loops, main_loop
from tuner.kernels.variant import parse_variant_name

SERIALIZED = "wgmma.mma_async instructions are serialized"  # ptxas's note (C75xx) when it gives up overlap


@dataclass(frozen=True)
class Count:
    """One build of a variant: its consumer loop and the kernel around it."""

    loop: LoopBudget
    masked: int  # the other innermost wgmma loop's instructions (the partial tiles' loop where split), else 0
    kernel: int  # the main function's static instructions
    registers: int
    spill_bytes: int  # spill stores plus stack frame (cuobjdump's LOCAL / STACK for a cubin read from a folder)
    serialized: str  # "yes" where ptxas serialised the wgmmas (C7512 and kin), "-" unknown (a cubin's)


_RES = re.compile(r"Function (\S+):\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:\d+\s+LOCAL:(\d+)")


def _resources(cubin: bytes, function: str) -> tuple[int, int]:
    """(registers, stack + local bytes) of `function`, from cuobjdump -res-usage."""
    for m in _RES.finditer(cuobjdump(cubin, "-res-usage")):
        if m.group(1) == function:
            return int(m.group(2)), int(m.group(3)) + int(m.group(4))
    raise ValueError(f"{function} not in cuobjdump -res-usage's output")


def masked_loop(code: str, name: str, main: LoopBudget) -> int:
    """Instructions of the innermost wgmma loop other than the main one (none: 0). The consumer runs a head's
    partial query tiles (the causal diagonal's) in a loop of its own beside the whole tiles' (SPLIT_MASK)."""
    instrs = functions(code)[name]
    spans = [(f, last) for f, last in loops(instrs)
             if any(i.opcode in TENSOR_OPS for i in instrs[f:last + 1])
             and not any(i.opcode == "EXIT" for i in instrs[f:last + 1])]
    inner = [(f, last) for f, last in spans
             if not any(g >= f and m <= last and (g, m) != (f, last) for g, m in spans)
             and instrs[f].addr != main.start]
    return min((last - f + 1 for f, last in inner), default=0)


def count_cubin(cubin: bytes, name: str) -> Count:
    code = cubin_sass(cubin)
    loop = main_loop(code, name)
    regs, spills = _resources(cubin, name)
    return Count(loop, masked_loop(code, name, loop), len(functions(code)[name]), regs, spills, "-")


def count_build(name: str) -> Count:
    """This checkout's build of `name` (nvcc through the compile cache: set TUNER_CACHE_DIR)."""
    res = compile_source(render(parse_variant_name(name)), name, "sm_90a")
    if not res.ok:
        raise SystemExit(f"{name}: compile failed\n{res.log[-2000:]}")
    code = cubin_sass(res.cubin)
    loop = main_loop(code, name)
    return Count(loop, masked_loop(code, name, loop), len(functions(code)[name]), res.registers,
                 res.spill_bytes + res.stack_bytes, "yes" if SERIALIZED in res.log else "no")


def counts_of(name: str, cubins: dict[str, Path], this: bool) -> dict[str, Count]:
    out = {label: count_cubin((folder / f"{name}.cubin").read_bytes(), name) for label, folder in cubins.items()
           if (folder / f"{name}.cubin").is_file()}  # a folder without the variant: no row
    if this or not cubins:
        out["this"] = count_build(name)
    return out


def print_rows(name: str, by_label: dict[str, Count], ops: bool) -> None:
    print(f"\n{name}")
    print(f"  {'':8s}{'loop':>7s}{'every':>7s}{'cond.':>7s}{'masked':>7s}{'R2UR':>6s}{'YIELD':>6s}{'kernel':>8s}"
          f"{'regs':>6s}{'spill':>7s}{'serial':>7s}")
    for label, c in by_label.items():
        lp = c.loop
        print(f"  {label:8s}{lp.total:7d}{lp.total - lp.conditional:7d}{lp.conditional:7d}{c.masked:7d}"
              f"{lp.counts['R2UR']:6d}{lp.counts['YIELD']:6d}{c.kernel:8d}{c.registers:6d}{c.spill_bytes:7d}"
              f"{c.serialized:>7s}")
    if ops:
        all_ops: Counter[str] = Counter()
        for c in by_label.values():
            all_ops.update(c.loop.counts)
        print(f"  {'opcode':10s}" + "".join(f"{label:>8s}" for label in by_label))
        for op, _ in all_ops.most_common():
            print(f"  {op:10s}" + "".join(f"{c.loop.counts.get(op, 0):8d}" for c in by_label.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="read <variant>.cubin from DIR (build_cubins.py) as row LABEL; repeatable")
    ap.add_argument("--this", action="store_true", help="with --cubins: this checkout's build as a row too")
    ap.add_argument("--ops", action="store_true", help="the loop by opcode")
    args = ap.parse_args()
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    print("loop: the consumer loop's static instructions a query tile (per warp; split: the whole tiles' loop); "
          "every: less its blocks under a predicated forward branch (cond.: a partial tile's mask); masked: the "
          "partial tiles' loop where split; spill: bytes; serial: ptxas serialised the wgmmas")
    for name in args.variants:
        print_rows(name, counts_of(name, cubins, args.this), args.ops)


if __name__ == "__main__":
    main()
