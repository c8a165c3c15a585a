"""GPU check of issue 38, items 1 and 6: a trial is timed without the energy meter (back to back, ~0.1 s of
repetitions) unless the objective is energy, and its Timing arrives whole from the GPU worker.

For each objective, one GPU worker measures the same few built variants several times, as a search does
(GpuBackend.submit_measure: verify, then time); printed per objective: the median seconds the worker held
one measurement (issue 38's target at B8 H16 S2048 D128: at most 0.15 s under time), whether its Timing
carries energy (time: never; energy: always, where NVML has the counter), and its µs. Then, under the time
objective, one confirm round of the same variants and the baselines (not metered: the race decides on µs) and
the confirm stage's energy pass on them (every timing of it metered).

    python benchmarks/trial_time_check.py --gpu h200 --shape 8,16,2048,128 --variants 3 --repeat 5

Exit status 1 when a check fails (a trial metered under time, an unmetered one under energy, a metered confirm
round under time, an energy pass without energy where NVML has it, or a time-objective measurement over --max-s).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from tuner.backends.gpu import GpuBackend
from tuner.kernels.feasibility import feasible_space
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.build import build_many
from tuner.runtime.energy import EnergyMeter
from tuner.runtime.timed import Timing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="auto")
    ap.add_argument("--shape", default="8,16,2048,128")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--hkv", type=int, default=None, help="K/V heads (GQA); default: as many as query heads")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--template", default="attn_fwd_wgmma")
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-s", type=float, default=0.15, help="the time objective's target per measurement")
    args = ap.parse_args()
    profile = resolve_profile(args.gpu)
    problem = problem_from_shape(args.shape, dtype=args.dtype, causal=args.causal, heads_kv=args.hkv)
    space = feasible_space(args.template, problem, profile)
    builts = [b for b in build_many(space[:: max(1, len(space) // args.variants)][: args.variants], profile.nvcc_arch)
              if b.ok]
    nvml = EnergyMeter(0).available
    print(f"{problem.label} on {profile.name}: {len(builts)} variants of {args.template}; NVML energy counter: {nvml}")
    failed = []
    for objective in ("time", "energy"):
        if objective == "energy" and not nvml:
            print("energy: skipped (no NVML energy counter)")
            continue
        with GpuBackend(profile, objective=objective) as backend:
            backend.measure(problem, builts[0].variant, builts[0])  # warm: inputs, reference, first load
            seconds, metered, us = [], [], []
            for _ in range(args.repeat):
                for built in builts:
                    pending = backend.submit_measure(problem, built.variant, built)
                    m = pending.result()
                    if m.timing is None:
                        print(f"  {built.variant.name}: {m.status.value} {m.error or ''}")
                        continue
                    assert isinstance(m.timing, Timing) and m.timing.reps, m.timing  # whole: reps crossed the pipe
                    seconds.append(pending.seconds)
                    metered.append(m.timing.energy is not None)
                    us.append(m.timing.median_us)
            if objective == "time":
                raced = backend.confirm(problem, [b.variant for b in builts], builts, 1)
                timings = backend.confirm(problem, [b.variant for b in builts], builts, 1, first_round=1,
                                          energy_pass=True)
        held = statistics.median(seconds)
        print(f"{objective}: {len(seconds)} measurements, median {held:.3f} s held by the worker "
              f"(min {min(seconds):.3f}, max {max(seconds):.3f}); metered {sum(metered)}/{len(metered)}; "
              f"µs {min(us):.1f}-{max(us):.1f}")
        if objective == "time" and (any(metered) or held > args.max_s):
            failed.append(f"time: metered {sum(metered)}, median {held:.3f} s (target {args.max_s} s)")
        if objective == "energy" and not all(metered):
            failed.append(f"energy: {metered.count(False)} measurements without energy")
    if any(e[0] is not None for e in raced.energy.values()):
        failed.append("confirm: a race round metered under time")
    confirm_energy = {impl: e[0] for impl, e in timings.energy.items()}
    print("energy pass (time objective): " + ", ".join(
        f"{impl} {timings.rounds[impl][0]:.1f} µs {'%.4g J' % e.joules_per_call if e else 'no energy'}"
        for impl, e in confirm_energy.items()))
    if nvml and not all(e is not None for e in confirm_energy.values()):
        failed.append("energy pass: a timing without energy")
    for line in failed:
        print("FAILED " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
