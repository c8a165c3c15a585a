"""What a trial leaves behind: its store record, and the small guards the loop writes outcomes with."""

from __future__ import annotations

from typing import Any, Optional

from optuna.trial import Trial

from tuner.backends.base import Measurement
from tuner.kernels.compiler import CompileResult
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.status import TrialStatus
from tuner.store import TrialRecord


def set_attr(trial: Trial, key: str, value: Any) -> None:
    """A trial attribute, unless another worker already finished (reaped) the trial."""
    try:
        trial.set_user_attr(key, value)
    except RuntimeError:
        pass


def compile_exception(variant: Variant, arch: str, exc: BaseException) -> CompileResult:
    """A failed compile carrying the exception as its log (stored as a compile_error trial)."""
    return CompileResult(False, variant.name, arch, None, "", 0, 0, 0, 0, 0.0, f"{type(exc).__name__}: {exc}")


def trial_record(run_id: int, problem: Problem, template_hash: str, study: str, number: int, variant: Variant,
                 status: TrialStatus, *, error: Optional[str] = None, measurement: Optional[Measurement] = None,
                 compiled: Optional[CompileResult] = None, smem_bytes: Optional[int] = None) -> TrialRecord:
    """The store row of one trial (one transaction): the measurement and nvcc's figures, as far as they got."""
    m = measurement
    return TrialRecord(
        run_id=run_id, problem=problem, template=variant.template, template_hash=template_hash,
        params=variant.stored_params(), variant_name=variant.name, status=status, study=study, trial_number=number,
        timing=m.timing if m else None, rel_error=m.rel_error if m else None,
        compile_s=compiled.seconds if compiled else None,
        registers=compiled.registers if compiled and compiled.ok else None,
        spill_bytes=compiled.spill_bytes if compiled and compiled.ok else None,
        cubin_sha256=(compiled.cubin_sha256 or None) if compiled else None,
        compile_log=compiled.log if compiled and not compiled.ok else None, smem_bytes=smem_bytes, error=error,
    )
