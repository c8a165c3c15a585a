"""The process ncu profiles: `python -m tuner.reporting.ncu_replay --template ... --range ...`.

It builds one stored variant (from the compile cache), makes inputs, and
launches the kernel a few times inside one NVTX range, which is all that ncu
(started by tuner.reporting.profiling) collects.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Mapping, Optional, Sequence

from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.nvtx import annotate, nvtx_available
from tuner.runtime.verify import empty_output, fp8_inputs, make_inputs, ragged_seq_lens

DEFAULT_LAUNCHES = 3


def replay_trial(template: str, params: Mapping[str, Any], problem: Problem, arch: str, nvtx_range: str,
                 launches: int = DEFAULT_LAUNCHES, device: int = 0, expect_gpu: Optional[str] = None) -> str:
    """Build (from the compile cache) and launch one variant `launches` times inside the NVTX range.

    One warm-up launch runs outside the range (module load, first-launch
    costs). Returns the variant name. Needs a GPU, pycuda and nvtx.
    """
    import torch

    cuda_driver(device)
    if not nvtx_available():
        raise TunerError("the nvtx package is not installed (pip install nvtx): ncu cannot select the kernel")
    name = torch.cuda.get_device_name(device)
    if expect_gpu and expect_gpu != name:
        raise TunerError(f"the trial was measured on {expect_gpu}, but this GPU is {name}")
    variant = Variant.from_stored(template, params)
    built = build(variant, arch, lineinfo=True)  # ncu maps its counters to source lines
    if not built.ok:
        raise TunerError(f"{variant.name} does not compile for {arch}: {built.compiled.log.strip().splitlines()[-1:]}")
    kernel = built.load(device)
    # An e4m3 problem's kernel takes its descales too (a 16-bit one's is called without them).
    extra: dict[str, Any] = {}
    if problem.fp8:
        q, k, v, extra["descales"] = fp8_inputs(problem)
    else:
        q, k, v = make_inputs(problem)
    out = empty_output(q)
    # A ragged batch's lengths, as its trials ran (the work profiled is the work measured).
    lens = ragged_seq_lens(problem, q.device)
    kernel(q, k, v, out, seq_lens=lens, **extra)
    torch.cuda.synchronize()
    for _ in range(launches):
        with annotate(nvtx_range):
            kernel(q, k, v, out, seq_lens=lens, **extra)
    torch.cuda.synchronize()
    return variant.name


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the profiled process: `python -m tuner.reporting.ncu_replay --template ... --range ...`."""
    ap = argparse.ArgumentParser(prog="python -m tuner.reporting.ncu_replay", description=main.__doc__)
    ap.add_argument("--template", required=True)
    ap.add_argument("--params", required=True, help="stored params (JSON), as in the results store")
    ap.add_argument("--problem", required=True, help="Problem fields (JSON)")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--range", required=True, dest="nvtx_range")
    ap.add_argument("--launches", type=int, default=DEFAULT_LAUNCHES)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--expect-gpu", default=None)
    args = ap.parse_args(argv)
    try:
        name = replay_trial(args.template, json.loads(args.params), Problem.from_dict(json.loads(args.problem)), args.arch,
                            args.nvtx_range, args.launches, args.device, args.expect_gpu)
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"replayed {name} {args.launches} times in NVTX range {args.nvtx_range}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
