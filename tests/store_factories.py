"""Small builders of store records for the store tests (not fixtures: plain functions)."""

from __future__ import annotations

from typing import Any

from tuner.problem import Problem
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, RunInfo, TrialRecord

H100 = RunInfo(gpu_name="NVIDIA H100 80GB HBM3", profile="h100", driver="560.35", cuda_version="12.6")
H200 = RunInfo(gpu_name="NVIDIA H200", profile="h200")
BIG = Problem(16, 16, 2048, 2048, 64)
SMALL = Problem(1, 8, 512, 512, 64, causal=True)


def trial(run_id: int, problem: Problem = BIG, *, params: dict[str, Any] | None = None, **fields: Any) -> TrialRecord:
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
        median_us=100.0,
    )
    values.update(fields)
    return TrialRecord(**values)


def baseline(run_id: int, problem: Problem = BIG, impl: str = "sdpa_flash", median_us: float = 120.0) -> BaselineRecord:
    return BaselineRecord(run_id=run_id, problem=problem, impl=impl, median_us=median_us)
