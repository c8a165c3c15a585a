"""Static instruction budget of variants' main loops (one K/V tile per iteration), by opcode; no GPU needed.

Compiles each variant for sm_90a with the checkout's templates (or reads <variant>.cubin from folders that
build_cubins.py filled from other template revisions) and prints, per variant, the main loop's instruction
count by opcode side by side (tuner/kernels/sass_budget.py says how the loop is found). Needs nvcc and
cuobjdump (the nvidia-cuda-cuobjdump wheel).

    python benchmarks/sass_budget.py VARIANT [VARIANT ...]                       # this checkout
    python benchmarks/sass_budget.py --cubins old=.ab/old --cubins new=.ab/new VARIANT ...   # revisions
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tuner.kernels.sass_budget import MATH_OPS, LoopBudget, cubin_sass, main_loop
from tuner.kernels.variant import parse_variant_name
from tuner.runtime.build import build


def budgets(name: str, cubins: dict[str, Path]) -> dict[str, LoopBudget]:
    """The main loop of `name` per label: each folder's cubin, else this checkout's build ('this')."""
    if not cubins:
        built = build(parse_variant_name(name), "sm_90a")
        if not built.ok:
            raise SystemExit(f"{name}: compile failed\n{built.compiled.log[-2000:]}")
        return {"this": main_loop(cubin_sass(built.compiled.cubin), name)}
    return {label: main_loop(cubin_sass((folder / f"{name}.cubin").read_bytes()), name)
            for label, folder in cubins.items()}


def print_table(name: str, by_label: dict[str, LoopBudget]) -> None:
    labels = list(by_label)
    print(f"\n{name}: main loop, instructions per K/V tile per warp (static)")
    print(f"  {'opcode':10s}" + "".join(f"{label:>10s}" for label in labels))
    ops: Counter[str] = Counter()
    for b in by_label.values():
        ops.update(b.counts)
    for op, _ in ops.most_common():
        print(f"  {op:10s}" + "".join(f"{by_label[label].counts.get(op, 0):10d}" for label in labels)
              + ("" if op not in MATH_OPS else "   (math)"))
    print(f"  {'all':10s}" + "".join(f"{by_label[label].total:10d}" for label in labels))
    print(f"  {'non-math':10s}" + "".join(f"{by_label[label].non_math:10d}" for label in labels))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="read <variant>.cubin from DIR (build_cubins.py), as column LABEL; repeatable")
    args = ap.parse_args()
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    for name in args.variants:
        print_table(name, budgets(name, cubins))


if __name__ == "__main__":
    main()
