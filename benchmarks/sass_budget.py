"""Static instruction budget of variants' main loops (one K/V tile per iteration), by opcode; no GPU needed.

Compiles each variant for sm_90a with the checkout's templates (or reads <variant>.cubin from folders that
build_cubins.py filled from other template revisions) and prints, per variant, the main loop's instruction
count by opcode side by side (tuner/kernels/sass_budget.py says how the loop is found), then the consumer's
per-item code (item_code: what runs once per work item outside the main loop) by opcode. Needs nvcc and
cuobjdump (the nvidia-cuda-cuobjdump wheel).

    python benchmarks/sass_budget.py VARIANT [VARIANT ...]                       # this checkout
    python benchmarks/sass_budget.py --cubins old=.ab/old --cubins new=.ab/new VARIANT ...   # revisions
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tuner.kernels.sass_budget import MATH_OPS, ItemBudget, LoopBudget, cubin_sass, item_code, main_loop
from tuner.kernels.variant import parse_variant_name
from tuner.runtime.build import build


def sass_of(name: str, cubins: dict[str, Path]) -> dict[str, str]:
    """The SASS of `name` per label: each folder's cubin, else this checkout's build ('this')."""
    if not cubins:
        built = build(parse_variant_name(name), "sm_90a")
        if not built.ok:
            raise SystemExit(f"{name}: compile failed\n{built.compiled.log[-2000:]}")
        return {"this": cubin_sass(built.compiled.cubin)}
    return {label: cubin_sass((folder / f"{name}.cubin").read_bytes()) for label, folder in cubins.items()}


def print_table(name: str, by_label: dict[str, LoopBudget], items: dict[str, ItemBudget]) -> None:
    labels = list(by_label)
    for title, table in ((f"main loop, instructions per K/V tile per warp (static)", by_label),
                         (f"per-item code, instructions per work item per warp outside the main loop (static)", items)):
        print(f"\n{name}: {title}")
        print(f"  {'opcode':10s}" + "".join(f"{label:>10s}" for label in labels))
        ops: Counter[str] = Counter()
        for b in table.values():
            ops.update(b.counts)
        for op, _ in ops.most_common():
            print(f"  {op:10s}" + "".join(f"{table[label].per_tile(table[label].counts.get(op, 0)):10g}"
                                          for label in labels) + ("" if op not in MATH_OPS else "   (math)"))
        print(f"  {'all':10s}" + "".join(f"{table[label].per_tile(table[label].total):10g}" for label in labels))
    print(f"  {'non-math':10s}" + "".join(f"{by_label[label].per_tile(by_label[label].non_math):10g}"
                                          for label in labels) + "   (loop)")
    print(f"  {'cond.':10s}" + "".join(f"{by_label[label].per_tile(by_label[label].conditional):10g}"
                                       for label in labels)
          + "   (loop, under a predicated forward branch: a partial tile's mask)")
    print(f"  {'tiles':10s}" + "".join(f"{by_label[label].tiles:10d}" for label in labels)
          + "   (K/V tiles per loop iteration: the loop's counts are divided by it)")
    print(f"  {'cond.':10s}" + "".join(f"{items[label].conditional:10d}" for label in labels)
          + "   (per item, under a predicated forward branch)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="read <variant>.cubin from DIR (build_cubins.py), as column LABEL; repeatable")
    args = ap.parse_args()
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    for name in args.variants:
        code = sass_of(name, cubins)
        print_table(name, {label: main_loop(c, name) for label, c in code.items()},
                    {label: item_code(c, name) for label, c in code.items()})


if __name__ == "__main__":
    main()
