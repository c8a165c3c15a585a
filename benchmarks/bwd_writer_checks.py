"""Gradient checks of every DQ_WRITER tiling of the Hopper backward on each dense backward test problem (GPU).

One line a check (check_backward's), then "writer checks: OK/TOTAL ok". The call scripts of sessions 24-25 ran
this after each dQ-writer step.  Usage (repo root, GPU machine): PYTHONPATH=. python3 benchmarks/bwd_writer_checks.py
"""

from __future__ import annotations

from tests.gpu.reference_checks import DENSE_BACKWARD_PROBLEMS
from tuner.kernels.feasibility import feasible_space
from tuner.profiles import resolve_profile
from tuner.runtime.backward_verify import check_backward


def main() -> int:
    profile = resolve_profile("auto")
    bad = total = 0
    for p in DENSE_BACKWARD_PROBLEMS:
        variants = [v for v in feasible_space("attn_bwd_wgmma", p, profile) if v.params.get("DQ_WRITER")]
        for c in check_backward(p, variants, profile):
            total += 1
            bad += not c.ok
            print(c.line(p.label))
    print(f"writer checks: {total - bad}/{total} ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
