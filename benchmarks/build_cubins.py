"""Build variants' cubins with the checkout on sys.path into a folder, for an A/B across template revisions.

Run it from an older checkout (a git worktree of the revision to compare with); carry the folder to the GPU
machine and give it to ab_ratio.py --old-cubins, which times those cubins beside the current build.

    PYTHONPATH=/path/to/old/checkout python benchmarks/build_cubins.py --out .ab/old VARIANT [VARIANT ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.kernels.variant import parse_variant_name
from tuner.runtime.build import build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.variants:
        built = build(parse_variant_name(name), args.arch)
        if not built.ok:
            raise SystemExit(f"{name}: compile failed\n{built.compiled.log[-2000:]}")
        (args.out / f"{name}.cubin").write_bytes(built.compiled.cubin)
        print(f"{name}: {built.compiled.registers} registers, {built.compiled.spill_bytes} spill bytes")


if __name__ == "__main__":
    main()
