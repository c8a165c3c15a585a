"""The tuner's door to the CUDA driver: tuner.runtime.launcher with the tuner's error types.

Only this module (and the launcher it wraps) import pycuda; everything else
in the package imports and runs without a GPU.
"""

from __future__ import annotations

from typing import Any

from tuner.errors import NoGpuError
from tuner.runtime.launcher import GpuUnavailableError, bind_torch_context


def cuda_driver(device: int = 0) -> Any:
    """Bind PyCUDA to torch's primary context on `device`; NoGpuError when impossible."""
    try:
        return bind_torch_context(device)
    except GpuUnavailableError as exc:
        raise NoGpuError(str(exc)) from None
