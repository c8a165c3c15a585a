"""Static instruction budget of variants' main loops (one K/V tile per iteration), by opcode; no GPU needed.

Compiles each variant for sm_90a with the checkout's templates (or reads <variant>.cubin from folders that
build_cubins.py filled from other template revisions) and prints, per variant, the main loop's instruction
count by opcode side by side (tuner/kernels/sass_budget.py says how the loop is found), then the consumer's
per-item code (item_code: what runs once per work item outside the main loop) by opcode. Needs nvcc and
cuobjdump (the nvidia-cuda-cuobjdump wheel). A decode variant (attn_decode_*) gets the decode table instead
(tuner/kernels/decode_budget.py): what every tile runs, each conditional block of the loop (thread 0's refill,
the paged path, the partial tile's mask, the last tile's zeroed V rows), and the per-call code around the loop.

    python benchmarks/sass_budget.py VARIANT [VARIANT ...]                       # this checkout
    python benchmarks/sass_budget.py --cubins old=.ab/old --cubins new=.ab/new VARIANT ...   # revisions
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tuner.kernels.decode_budget import DecodeBudget, decode_budget
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


def _rows(title: str, by_label: dict[str, Counter[str]], labels: list[str], per_op: bool) -> None:
    """One section of the decode table: opcode rows (per_op) and its total."""
    print(f"  {title}")
    ops: Counter[str] = Counter()
    for c in by_label.values():
        ops.update(c)
    for op, _ in ops.most_common() if per_op else []:
        print(f"    {op:12s}" + "".join(f"{by_label[lb].get(op, 0):10d}" for lb in labels)
              + ("   (math)" if op in MATH_OPS else ""))
    print(f"    {'all':12s}" + "".join(f"{sum(by_label[lb].values()):10d}" for lb in labels))


def print_decode(name: str, by_label: dict[str, DecodeBudget]) -> None:
    """A decode kernel's loop by block and its per-call code, static instructions per warp."""
    labels = list(by_label)
    print(f"\n{name}: static instructions per warp" + "".join(f"{lb:>10s}" for lb in labels))
    _rows("main loop, all of it", {lb: b.loop.counts for lb, b in by_label.items()}, labels, False)
    _rows("every tile, every warp", {lb: b.every_tile for lb, b in by_label.items()}, labels, True)
    blocks: dict[str, dict[str, Counter[str]]] = {}
    for lb, b in by_label.items():
        for top in b.blocks:
            blocks.setdefault(top.label, {})[lb] = top.own
            for kid in top.children:
                blocks.setdefault(f"{top.label} > {kid.label}", {})[lb] = kid.counts
    for title, table in blocks.items():
        _rows(f"conditional: {title}", {lb: table.get(lb, Counter()) for lb in labels}, labels, True)
    _rows("per call, before the loop", {lb: b.prologue for lb, b in by_label.items()}, labels, False)
    _rows("per call, after the loop (the merges, O's store)", {lb: b.epilogue for lb, b in by_label.items()},
          labels, False)
    print(f"    {'divisions':12s}" + "".join(f"{b.loop_divisions:10d}" for b in by_label.values())
          + "   (runtime integer divisions in the loop: I2F.RP)")
    print(f"    {'IABS':12s}" + "".join(f"{b.loop_signed:10d}" for b in by_label.values())
          + "   (signed ones' absolute values, in the loop)")
    print(f"    {'divisions':12s}" + "".join(f"{b.call_divisions:10d}" for b in by_label.values())
          + "   (per call)")
    print(f"    {'IABS':12s}" + "".join(f"{b.call_signed:10d}" for b in by_label.values()) + "   (per call)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="read <variant>.cubin from DIR (build_cubins.py), as column LABEL; repeatable")
    args = ap.parse_args()
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    for name in args.variants:
        code = sass_of(name, cubins)
        if name.startswith("attn_decode_"):
            print_decode(name, {label: decode_budget(c, name) for label, c in code.items()})
            continue
        print_table(name, {label: main_loop(c, name) for label, c in code.items()},
                    {label: item_code(c, name) for label, c in code.items()})


if __name__ == "__main__":
    main()
