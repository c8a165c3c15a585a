"""The tuner's door to the CUDA driver: tuner.launcher with the tuner's error types.

Only this module (and the launcher it wraps) import pycuda; everything else
in the package imports and runs without a GPU.
"""

from __future__ import annotations

from typing import Any

from tuner.errors import NoGpuError, TunerError
from tuner.launcher import (  # noqa: F401 - re-exported
    AttentionInputError,
    AttentionKernel,
    GpuUnavailableError,
    LaunchShape,
    bind_torch_context,
)
from tuner.launcher import check_attention_tensors as _check


def cuda_driver(device: int = 0) -> Any:
    """Bind PyCUDA to torch's primary context on `device`; NoGpuError when impossible."""
    try:
        return bind_torch_context(device)
    except GpuUnavailableError as exc:
        raise NoGpuError(str(exc)) from None


def check_attention_tensors(q: Any, k: Any, v: Any, out: Any, lse: Any = None) -> None:
    try:
        _check(q, k, v, out, lse)
    except AttentionInputError as exc:
        raise TunerError(str(exc)) from None
