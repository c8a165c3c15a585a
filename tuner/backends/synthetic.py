"""A synthetic recording for the replay backend: every feasible variant of a problem, with made-up timings.

For tests and demos on machines without a GPU. The numbers are NOT
measurements: they come from a crude efficiency model plus deterministic
noise, and the recording's run says so (host "synthetic"). A real recording
is simply a results store written by `tuner search` on a GPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Iterable

from tuner.backends.replay import synthetic_run_info
from tuner.kernels.feasibility import feasible_space
from tuner.kernels.manifest import load_manifest
from tuner.dtypes import spec
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.baselines import sdpa_skipped
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, TrialRecord, open_store

# Relative efficiency of known parameter values (unknown ones get a hashed factor in [0.85, 1]).
_FACTORS: dict[str, dict[object, float]] = {
    "BLOCK_M": {32: 0.6, 64: 0.85, 128: 1.0},
    "BLOCK_N": {32: 0.7, 64: 0.95, 128: 0.9},
    "NUM_WARPS": {2: 0.75, 4: 1.0, 8: 0.92},
    "KV_SPLIT": {1: 1.0, 2: 0.93, 4: 0.85},
    "SWIZZLE": {"none": 0.8, "pad": 0.95, "xor": 1.0},
    "STAGES": {1: 0.8, 2: 1.0, 3: 0.98},
    "Q_IN_REGS": {True: 1.0, False: 0.93},
}
_BEST_EFFICIENCY = 0.6  # of the dense peak, for the best variant
_BASELINES = {"sdpa_cudnn": 0.55, "sdpa_flash": 0.45, "sdpa_efficient": 0.3}
_LAUNCH_US = 6.0
_POWER_LIMIT_W = 700.0  # back to back a card sits at its limit; variants draw 80-100% of it (made up)


def _unit(text: str) -> float:
    """A deterministic number in [0, 1) from text."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16**12


def _factor(name: str, value: object) -> float:
    known = _FACTORS.get(name, {})
    if value in known and type(value) is type(next(iter(known))):
        return known[value]
    return 0.85 + 0.15 * _unit(f"{name}={value!r}")


def synthetic_time_us(problem: Problem, params: dict, peak_tflops: float, key: str) -> float:
    eff = _BEST_EFFICIENCY
    for name, value in params.items():
        eff *= _factor(name, value)
    noise = 1.0 + 0.03 * (2 * _unit("noise:" + key) - 1)
    return (problem.flops / (peak_tflops * 1e12 * eff) * 1e6 + _LAUNCH_US) * noise


def synthetic_timing(key: str, us: float, spread: float, energy: bool, isolated: bool) -> Timing:
    """A synthetic Timing of `us` (p20 / p80 `spread` below / above it), the value a GPU worker gives: with
    made-up energy (board power 80-100% of the limit, by a hash of `key`; J per call = power x µs) and
    isolated µs (5-15% below the back-to-back µs: the boost clock)."""
    power = _POWER_LIMIT_W * (0.8 + 0.2 * _unit("power:" + key))
    return Timing(us, us * (1 - spread), us * (1 + spread), None,
                  Energy(power * us * 1e-6, power, 1980.0 - 600.0 * power / _POWER_LIMIT_W) if energy else None,
                  us * (0.85 + 0.1 * _unit("isolated:" + key)) if isolated else None)


def write_synthetic_recording(url: str, problems: Iterable[Problem], *, profile: str = "h100",
                              template: str = "attn_fwd_mma", gpu_name: str = "NVIDIA H100 80GB HBM3",
                              energy: bool = True, isolated: bool = False) -> int:
    """Record every feasible variant of each problem (ok, with a few incorrect/launch_error/timeout) and
    the SDPA baselines that take it into the store at `url`; returns the number of trials written.
    `energy`: with made-up energy figures (False: a recording made before energy was measured);
    `isolated`: with made-up isolated µs (what a search with --objective isolated records)."""
    prof = load_profile(profile)
    manifest = load_manifest(template)
    written = 0
    with open_store(url) as store:
        run_id = store.start_run(synthetic_run_info(gpu_name, profile))
        for problem in problems:
            peak = prof.peak_tflops(problem.dtype)
            # The baselines run in the registry's baseline type (e4m3's bf16, an FP8 KV cache's query dtype), at its
            # peak (tuner.runtime.baselines).
            baseline_peak = prof.peak_tflops(spec(problem.dtype).baseline.name)
            skipped = sdpa_skipped(problem)  # as a GPU worker would: no SDPA where it cannot express the problem
            for impl, eff in ((i, e) for i, e in _BASELINES.items() if i not in skipped):
                us = problem.flops / (baseline_peak * 1e12 * eff) * 1e6 + _LAUNCH_US
                store.add_baseline(BaselineRecord(run_id=run_id, problem=problem, impl=impl,
                                                  timing=synthetic_timing(impl + problem.label, us, 0.01, energy, isolated)))
            for variant in feasible_space(template, problem, prof):
                name = variant.name
                us = synthetic_time_us(problem, dict(variant.params), peak, name + problem.label)
                fate = _unit("fate:" + name + problem.label)
                timing = synthetic_timing(name + problem.label, us, 0.02, energy, isolated)
                fields: dict = dict(timing=timing, rel_error=4e-4)
                status = TrialStatus.OK
                if fate < 0.03:
                    status, fields = TrialStatus.INCORRECT, dict(timing=replace(timing, energy=None, isolated_us=None),
                                                           rel_error=0.05, error="rel error 5.0e-02 > 2.0e-03 (synthetic)")
                elif fate < 0.05:
                    status, fields = TrialStatus.LAUNCH_ERROR, dict(error="an illegal memory access was encountered (synthetic)")
                elif fate < 0.06:
                    status, fields = TrialStatus.TIMEOUT, dict(error="kernel timed out after 10 s (synthetic)")
                store.add_trial(TrialRecord(run_id=run_id, problem=problem, template=template,
                                            template_hash=manifest.source_hash, params=variant.stored_params(),
                                            variant_name=name, status=status, **fields))
                written += 1
        store.finish_run(run_id)
    return written
