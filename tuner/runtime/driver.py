"""PyCUDA bound to torch's primary context, with the tuner's errors: PyCUDA's one job in the tuner.

A GPU worker (and ncu's replay) binds the context of its JIT path here before it loads what it builds.
Everything else that speaks to the driver goes through the one ctypes door,
tuner/runtime/shipped/cuda_driver.py: the kernels' loads and launches (as in an exported package), and the
device query and driver version (tuner/profiles/cuda_query.py). Only this module imports pycuda;
everything else in the package imports and runs without a GPU.
"""

from __future__ import annotations

import atexit
from typing import Any

from tuner.errors import NoGpuError

_bound: dict[str, Any] = {}  # pycuda.driver and the pushed primary context, once bound


def cuda_driver(device: int = 0) -> Any:
    """Bind PyCUDA to torch's primary context on `device` (once per process); returns pycuda.driver.
    NoGpuError when there is no GPU or no pycuda."""
    if "drv" in _bound:
        return _bound["drv"]
    import torch

    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible to torch on this machine")
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise NoGpuError(f"pycuda is not installed ({exc}); install the gpu extra: "
                         "pip install 'flashcore-tuner[gpu]'") from None
    torch.cuda.set_device(device)
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")  # torch creates (and makes current) the primary context
    drv.init()
    ctx = drv.Device(device).retain_primary_context()
    ctx.push()
    _bound.update(drv=drv, ctx=ctx)
    atexit.register(_release_context)
    return drv


def _release_context() -> None:
    """Pop our context at exit; PyCUDA aborts the process if one is left on its stack."""
    ctx = _bound.pop("ctx", None)
    _bound.pop("drv", None)
    if ctx is not None:
        ctx.pop()
        from pycuda.tools import clear_context_caches

        clear_context_caches()
