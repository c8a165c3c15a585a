"""Small builders of store records for the store tests (not fixtures: plain functions)."""

from __future__ import annotations

from typing import Any, Optional

from tuner.problem import Problem
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, RunInfo, TrialRecord

H100 = RunInfo(gpu_name="NVIDIA H100 80GB HBM3", profile="h100", driver="560.35", cuda_version="12.6")
H200 = RunInfo(gpu_name="NVIDIA H200", profile="h200")
BIG = Problem(16, 16, 2048, 2048, 64)
SMALL = Problem(1, 8, 512, 512, 64, causal=True)


TIMING_FIELDS = ("median_us", "p20_us", "p80_us", "energy", "isolated_us")


def timing(median_us: Optional[float], p20_us: Optional[float] = None, p80_us: Optional[float] = None,
           energy: Optional[Energy] = None, isolated_us: Optional[float] = None) -> Optional[Timing]:
    """The Timing of these figures; None without a median (a trial that was not timed)."""
    return None if median_us is None else Timing(median_us, p20_us, p80_us, None, energy, isolated_us)


def trial(run_id: int, problem: Problem = BIG, *, params: dict[str, Any] | None = None, **fields: Any) -> TrialRecord:
    """A trial record; its timing from the figures among `fields` (median_us 100 unless given)."""
    figures = {"median_us": 100.0} | {key: fields.pop(key) for key in TIMING_FIELDS if key in fields}
    params = params if params is not None else {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4}
    name = "attn_fwd_mma_" + "_".join(f"{k.lower()}{v}" for k, v in sorted(params.items()))
    values: dict[str, Any] = dict(
        run_id=run_id,
        problem=problem,
        template="attn_fwd_mma",
        template_hash="h1",
        params=params,
        variant_name=name,
        status=TrialStatus.OK,
        timing=timing(**figures),
    )
    values.update(fields)
    return TrialRecord(**values)


def baseline(run_id: int, problem: Problem = BIG, impl: str = "sdpa_flash", median_us: float = 120.0,
             energy: Optional[Energy] = None) -> BaselineRecord:
    return BaselineRecord(run_id=run_id, problem=problem, impl=impl, timing=Timing(median_us, energy=energy))
