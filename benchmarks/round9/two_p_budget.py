"""Static budget of the TWO_P loop (issue 37, session 23) beside the kernel it changes: each VARIANT's cubin from
--base (build_cubins.py on main) against its `_2p` twin's from --two-p, as benchmarks/sass_budget.py prints
them (per K/V tile: the TWO_P loop does two tiles an iteration), plus the exp2 that run under P V.

    python benchmarks/round9/two_p_budget.py --base .ab/BASE --two-p .ab/TWO_P VARIANT [VARIANT ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sass_budget import print_table  # noqa: E402

from tuner.kernels.sass_budget import cubin_sass, exp2_under_pv, f2fp_after_full_wait, item_code, main_loop  # noqa: E402
from tuner.kernels.variant import parse_variant_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--two-p", type=Path, required=True)
    args = ap.parse_args()
    for name in args.variants:
        v = parse_variant_name(name)
        twin = dataclasses.replace(v, params={**v.params, "TWO_P": True}).name
        code = {"BASE": (name, cubin_sass((args.base / f"{name}.cubin").read_bytes())),
                "TWO_P": (twin, cubin_sass((args.two_p / f"{twin}.cubin").read_bytes()))}
        print_table(f"{name} / _2p", {label: main_loop(c, n) for label, (n, c) in code.items()},
                    {label: item_code(c, n) for label, (n, c) in code.items()})
        for label, (n, c) in code.items():
            under, total = exp2_under_pv(c, n)
            print(f"  {label}: {under} of {total} exp2 in the loop after the S wait, P V in flight; "
                  f"{f2fp_after_full_wait(c, n)} F2FP between a wait_group 0 and the next wgmma issue")


if __name__ == "__main__":
    main()
