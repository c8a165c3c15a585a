"""Record a grid with repeated timings, for `tuner replay-eval` to learn the GPU's noise.

A seeded sample of a problem's feasible variants is compiled, then timed in
R rounds on one card (the order shuffled each round, the SDPA baselines timed
at the start of each round), each measurement exactly as a search takes it
(verified, then 25 ms warm-up and 100 ms of repetitions). Each round is one
run of the results store written here, so the replay backend finds R timings
per variant and draws one per measurement, and replay-eval takes their median
as the variant's true time. Points outside the sample are "not recorded":
a replayed search treats them like infeasible points (free).

    python benchmarks/record_grid.py --db sqlite:///grid.db --shape 8,16,2048,128 --variants 300 --rounds 3
"""

from __future__ import annotations

import argparse
import random
import time

from tuner.backends.gpu import GpuBackend
from tuner.kernels.feasibility import feasible_space
from tuner.kernels.manifest import load_manifest
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.build import build_many
from tuner.search.outcome import trial_record
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, RunInfo, open_store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--gpu", default="auto")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--template", default="attn_fwd_wgmma")
    ap.add_argument("--variants", type=int, default=300, help="feasible variants sampled (0: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    profile = resolve_profile(args.gpu)
    problem = problem_from_shape(args.shape, dtype=args.dtype)
    manifest = load_manifest(args.template)
    space = feasible_space(args.template, problem, profile)
    variants = space if not args.variants else random.Random(args.seed).sample(space, min(args.variants, len(space)))
    started = time.perf_counter()
    builts = [b for b in build_many(variants, profile.nvcc_arch) if b.ok]
    print(f"{len(builts)} of {len(variants)} sampled variants compiled ({len(space)} feasible) in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    rng = random.Random(args.seed + 1)
    with GpuBackend(profile) as backend, open_store(args.db) as store:
        facts = backend.device_facts()
        for r in range(args.rounds):
            run_id = store.start_run(RunInfo.for_this_process(
                gpu_name=facts.gpu_name, profile=profile.name, gpu_uuid=facts.gpu_uuid, driver=facts.driver,
                cuda_version=facts.cuda_version))
            for b in backend.baselines(problem):
                store.add_baseline(BaselineRecord(run_id=run_id, problem=problem, impl=b.impl, timing=b.timing))
            order = list(range(len(builts)))
            rng.shuffle(order)
            for number in order:
                built = builts[number]
                m = backend.measure(problem, built.variant, built)
                store.add_trial(trial_record(run_id, problem, manifest.source_hash, "grid", number, built.variant,
                                             TrialStatus.parse(m.status), error=m.error, measurement=m,
                                             compiled=built.compiled, smem_bytes=built.shape.smem_bytes))
            store.finish_run(run_id)
            print(f"round {r + 1}/{args.rounds} done at {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
