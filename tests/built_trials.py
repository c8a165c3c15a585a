"""A stored ok trial of a variant built here, as `tuner search` stores it: the test exports' way to fill a store."""

from __future__ import annotations

from typing import Any

from tuner.problem import Problem


def add_built_trial(store: Any, run: int, problem: Problem, variant: Any, arch: str, median_us: float,
                    rel_error: float) -> int:
    """Build `variant` for `arch` (it must compile) and store it as an ok trial of `problem` in `run`, with its
    template's hash and its cubin's sha256 (made-up timings); the trial id."""
    from tuner.kernels.manifest import load_manifest
    from tuner.runtime.build import build
    from tuner.status import TrialStatus
    from tuner.runtime.timed import Timing
    from tuner.store import TrialRecord

    built = build(variant, arch)
    assert built.ok, built.compiled.log[-2000:]
    return store.add_trial(TrialRecord(
        run_id=run, problem=problem, template=variant.template,
        template_hash=load_manifest(variant.template).source_hash, params=variant.stored_params(),
        variant_name=variant.name, status=TrialStatus.OK, timing=Timing(median_us), rel_error=rel_error,
        cubin_sha256=built.compiled.cubin_sha256))
