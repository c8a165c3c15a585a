"""The CUDA devices as the driver reports them, through the shipped runtime's door to libcuda.

Asking torch costs a process about two seconds (importing torch, then CUDA's
runtime); the driver answers in milliseconds and creates no context. Every
worker of a search asks before it starts its GPU process, so this is what
they use. CUDA_VISIBLE_DEVICES applies as it does to torch. The library is
opened and each call's result checked in tuner/runtime/shipped/cuda_driver.py
(importing it imports no torch); this module keeps only the query.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

from tuner.runtime.shipped import cuda_driver as _door
from tuner.runtime.shipped.cuda_driver import DriverError, check as _check

__all__ = ["DriverDevice", "DriverError", "driver_devices", "driver_version"]

_SM_COUNT, _CC_MAJOR, _CC_MINOR = 16, 75, 76  # CUdevice_attribute values


@dataclass(frozen=True)
class DriverDevice:
    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory_bytes: int
    uuid: str


def _library() -> Optional[Any]:
    """The driver library, None where this machine has none (then torch.cuda is asked instead)."""
    try:
        return _door.libcuda()
    except _door.GpuUnavailableError:
        return None


def driver_devices() -> Optional[list[DriverDevice]]:
    """The visible CUDA devices; None when there is no CUDA driver library on this machine.
    DriverError when the library is there but cannot serve (e.g. cuInit fails: no usable device)."""
    lib = _library()
    if lib is None:
        return None
    _check(lib.cuInit(0), "cuInit")
    count = ctypes.c_int(0)
    _check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return [_device(lib, index) for index in range(count.value)]


def _device(lib: Any, index: int) -> DriverDevice:
    handle = ctypes.c_int(0)
    _check(lib.cuDeviceGet(ctypes.byref(handle), index), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    _check(lib.cuDeviceGetName(name, len(name), handle), "cuDeviceGetName")

    def attribute(which: int) -> int:
        value = ctypes.c_int(0)
        _check(lib.cuDeviceGetAttribute(ctypes.byref(value), which, handle), "cuDeviceGetAttribute")
        return value.value

    memory = ctypes.c_size_t(0)
    _check(lib.cuDeviceTotalMem_v2(ctypes.byref(memory), handle), "cuDeviceTotalMem")
    raw = (ctypes.c_ubyte * 16)()
    _check(lib.cuDeviceGetUuid(raw, handle), "cuDeviceGetUuid")
    hexed = bytes(raw).hex()
    uuid = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
    return DriverDevice(index, name.value.decode(errors="replace"), (attribute(_CC_MAJOR), attribute(_CC_MINOR)),
                        attribute(_SM_COUNT), int(memory.value), uuid)


def driver_cuda_version() -> Optional[int]:
    """The CUDA version the driver supports (cuDriverGetVersion: e.g. 13000 for CUDA 13.0; no cuInit
    needed); None where this machine has no driver library."""
    lib = _library()
    if lib is None:
        return None
    version = ctypes.c_int(0)
    _check(lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    return version.value


def driver_version() -> Optional[str]:
    """The NVIDIA driver version (e.g. 580.65.06) from nvidia-smi, else the CUDA driver API version."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        version = driver_cuda_version()  # e.g. 13000 for CUDA 13.0
        return None if version is None else f"cuda {version // 1000}.{version % 1000 // 10}"
    except Exception:  # noqa: BLE001 - a missing fact is not an error
        return None
