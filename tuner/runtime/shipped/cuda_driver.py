"""The CUDA driver API through ctypes: kernel loading and launches on torch's current stream, and TMA
tensor maps. Needs the driver (libcuda.so.1) and torch, nothing else: no PyCUDA, no CUDA toolkit.

Part of the runtime every export ships (this folder, copied whole); imports nothing from `tuner`.
It is the one door to libcuda: the library is opened (libcuda) and a call's result checked (check) here
only, for the exports, the tuner's launches and its device query (tuner/profiles/cuda_query.py) alike.
The tuner's GPU worker also binds PyCUDA to torch's context (tuner/runtime/driver.py), for its JIT path.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

from .dtypes import ELEMENTS as _ELEMENTS

_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory


class AttentionInputError(ValueError):
    """Tensors a kernel cannot take; the message names the limit."""


class GpuUnavailableError(RuntimeError):
    """No CUDA GPU visible to torch, or no CUDA driver that can run the kernels."""


class DriverError(RuntimeError):
    """A driver call failed; the message names the call and the driver's error name and code."""


@lru_cache(maxsize=1)
def libcuda() -> Any:
    """The CUDA driver library, opened once (it comes with the NVIDIA driver, not the toolkit)."""
    import ctypes

    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise GpuUnavailableError(f"cannot open the CUDA driver library libcuda.so.1: {exc}") from None


class TensorMapEncoder:
    """TMA tensor maps (cuTensorMapEncodeTiled) of [B, H, S, D] tensors.

    A map encodes the tensor's address, extents and strides as 4-D (D, S, H, B),
    so BHSD, BSHD and GQA need no copy and rows past S read as zeros. Encoding
    is a driver call (about 9 us from Python, three per launch); the address
    is the map's first 8 bytes, so AttentionKernel keeps one map per layout
    and writes each call's addresses into it (`address_free`).
    """

    # CUtensorMapDataType by str(torch dtype), from the dtype registry's copy (e4m3 moves as bytes)
    _DTYPES = {f"torch.{e['torch']}": e["tensor_map"] for e in _ELEMENTS.values()}
    _SWIZZLES = {32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_{32B,64B,128B}
    _L2_PROMOTION_128B = 2
    CACHE_LIMIT = 256  # cached input layouts per kernel

    def __init__(self) -> None:
        import ctypes

        try:
            self._fn = libcuda().cuTensorMapEncodeTiled
        except AttributeError as exc:
            raise GpuUnavailableError(f"the CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12+): {exc}") from None
        self._fn.restype = ctypes.c_int
        self._ctypes = ctypes

    def encode(self, name: str, t: Any, rows: int, swizzle: int, address: int | None = None) -> bytes:
        """The map of tensor t (at `address` instead of t's own, if given)."""
        ct = self._ctypes
        b, h, s, d = t.shape
        esize = t.element_size()
        dims = [d, s, h, b]
        strides = [t.stride(2) * esize, t.stride(1) * esize, t.stride(0) * esize]
        for i in range(3):  # an extent-1 dim may have any stride (even 0); give it a valid one
            if dims[i + 1] == 1:
                strides[i] = (strides[i - 1] if i else esize) * dims[i]
        buf = (ct.c_ubyte * 192)()
        offset = -ct.addressof(buf) % 64  # CUtensorMap is 64-byte aligned
        rc = self._fn(ct.c_void_p(ct.addressof(buf) + offset), ct.c_int(self._DTYPES[str(t.dtype)]), ct.c_uint32(4),
                      ct.c_void_p(t.data_ptr() if address is None else address), (ct.c_uint64 * 4)(*dims), (ct.c_uint64 * 3)(*strides),
                      (ct.c_uint32 * 4)(swizzle // esize, rows, 1, 1), (ct.c_uint32 * 4)(1, 1, 1, 1),
                      ct.c_int(0), ct.c_int(self._SWIZZLES[swizzle]), ct.c_int(self._L2_PROMOTION_128B), ct.c_int(0))
        if rc != 0:
            raise AttentionInputError(f"{name}: TMA cannot address this tensor (cuTensorMapEncodeTiled error {rc}; "
                                      f"extents (D, S, H, B) {tuple(dims)}, byte strides {tuple(strides)}): strides "
                                      f"must be positive multiples of 16 bytes")
        return bytes(buf[offset:offset + 128])

    def address_free(self, name: str, t: Any, rows: int, swizzle: int) -> bytes | None:
        """t's map without its address (the last 120 bytes), valid for t's layout at any address;
        None where this driver's maps do not hold the address, alone, in their first 8 bytes."""
        here = t.data_ptr()
        maps = [self.encode(name, t, rows, swizzle, address) for address in (here, here + 4096)]
        for address, m in zip((here, here + 4096), maps):
            if int.from_bytes(m[:8], "little") != address:
                return None
        return maps[0][8:] if maps[0][8:] == maps[1][8:] else None


class DriverKernel:
    """One kernel of a cubin, loaded and launched through the CUDA driver API (ctypes), no PyCUDA.

    The cubin is loaded context-independently (cuLibraryLoadData, CUDA 12+): no context needs to be
    current to load it, and any thread may launch it. A launch runs in the device's primary context
    (torch's): where the calling thread has another context current (a thread that never touched this
    device), that one is pushed around the launch. Launches go to torch's current stream, so they order
    with the caller's work on any stream and a CUDA graph captures them.
    """

    _MAX_DYNAMIC_SMEM, _NUM_REGS, _NON_PORTABLE_CLUSTER = 8, 4, 14  # CUfunction_attribute values

    def __init__(self, cubin: bytes, entry: str, smem_bytes: int, param_format: str, cluster_size: int = 1,
                 device: int = 0) -> None:
        import ctypes
        import threading

        lib = self._lib = libcuda()
        self._ctx = primary_context(device)  # torch initialises the driver and the device first
        self._ctypes, self._library, self._fn = ctypes, ctypes.c_void_p(), ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))  # the driver may read it lazily
        check(lib.cuLibraryLoadData(ctypes.byref(self._library), self._image, None, None, 0, None, None, 0),
                    "cuLibraryLoadData")
        check(lib.cuLibraryGetKernel(ctypes.byref(self._fn), self._library, entry.encode()),
                    "cuLibraryGetKernel")
        dev = _cu_device(device)
        if smem_bytes > _DEFAULT_SMEM_LIMIT:
            check(lib.cuKernelSetAttribute(self._MAX_DYNAMIC_SMEM, smem_bytes, self._fn, dev),
                        "cuKernelSetAttribute")
        if cluster_size > 8:  # clusters of more than 8 CTAs must be allowed per kernel (sm_90: up to 16)
            check(lib.cuKernelSetAttribute(self._NON_PORTABLE_CLUSTER, 1, self._fn, dev), "cuKernelSetAttribute")
        regs = ctypes.c_int(0)
        check(lib.cuKernelGetAttribute(ctypes.byref(regs), self._NUM_REGS, self._fn, dev), "cuKernelGetAttribute")
        self.registers = regs.value
        self._lock = threading.Lock()
        self.use_format(param_format)
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self._current = ctypes.c_void_p()

    def use_format(self, param_format: str) -> None:
        """How launch() packs its arguments: a `struct` format, whose native mode aligns each field as the C
        compiler lays out the kernel's parameters. One buffer per kernel, packed in place each launch (the
        driver copies it at the launch, or into the graph node at a capture); the lock keeps two threads'
        launches apart."""
        import struct

        ct = self._ctypes
        packer = struct.Struct(param_format)
        params = ct.create_string_buffer(max(packer.size, 1))
        size = ct.c_size_t(packer.size)
        # CU_LAUNCH_PARAM_BUFFER_POINTER, the buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END
        extra = (ct.c_void_p * 5)(1, ct.addressof(params), 2, ct.addressof(size), 0)
        with self._lock:
            self._struct, self._params, self._size, self._extra = packer, params, size, extra
            self._extra_ptr = ct.cast(extra, ct.c_void_p)

    def param_offsets(self, count: int) -> list[int]:
        """The byte offsets of the kernel's first `count` parameters, as the compiler laid them out."""
        ct = self._ctypes
        offsets = []
        for index in range(count):
            offset, size = ct.c_size_t(), ct.c_size_t()
            check(self._lib.cuKernelGetParamInfo(self._fn, ct.c_size_t(index), ct.byref(offset),
                                                       ct.byref(size)), "cuKernelGetParamInfo")
            offsets.append(offset.value)
        return offsets

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple, smem_bytes: int,
               stream: int) -> None:
        """Launch with `args` (packed by the parameter format) on the CUstream `stream`."""
        lib = self._lib
        with self._lock:
            self._struct.pack_into(self._params, 0, *args)
            lib.cuCtxGetCurrent(self._ctypes.byref(self._current))
            pushed = self._current.value != self._ctx.value
            if pushed:  # this thread has no context, or another device's: launch in this device's
                check(lib.cuCtxPushCurrent_v2(self._ctx), "cuCtxPushCurrent")
            try:
                result = self._launch(self._fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                      smem_bytes, stream, None, self._extra_ptr)
            finally:
                if pushed:
                    lib.cuCtxPopCurrent_v2(self._ctypes.byref(self._current))
        if result:
            check(result, "cuLaunchKernel")

    def __del__(self) -> None:
        library = getattr(self, "_library", None)
        if library is not None and library.value and not sys.is_finalizing():  # the driver may be gone at exit
            self._lib.cuLibraryUnload(library)


def check(result: int, call: str) -> None:
    """DriverError naming the driver call and its error, when `result` is not CUDA_SUCCESS (cuGetErrorName
    needs no cuInit, so it names a failed cuInit too)."""
    if result:
        import ctypes

        name = ctypes.c_char_p()
        libcuda().cuGetErrorName(result, ctypes.byref(name))
        raise DriverError(f"{call} failed: {(name.value or b'CUDA error').decode()} ({result})")


def _cu_device(device: int) -> int:
    """The CUdevice of torch's device index (the same ordinal: both follow CUDA_VISIBLE_DEVICES)."""
    import ctypes

    dev = ctypes.c_int()
    check(libcuda().cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    return dev.value


_primary: dict[int, Any] = {}


def primary_context(device: int) -> Any:
    """The primary context of `device`, the one torch uses (initialised by torch first, retained once)."""
    ctx = _primary.get(device)
    if ctx is None:
        import ctypes

        import torch

        if not torch.cuda.is_available():
            raise GpuUnavailableError("no CUDA GPU is visible to torch on this machine")
        torch.zeros(1, device=f"cuda:{device}")  # torch creates the primary context (and initialises the driver)
        ctx = ctypes.c_void_p()
        check(libcuda().cuDevicePrimaryCtxRetain(ctypes.byref(ctx), _cu_device(device)),
              "cuDevicePrimaryCtxRetain")
        ctx = _primary.setdefault(device, ctx)
    return ctx


def stream_getter() -> Any:
    """The handle of torch's current stream on a device: torch's raw getter (no Stream object, ~7 us
    cheaper per call), else the public one."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return (lambda device: int(raw(device))) if raw is not None else \
        (lambda device: torch.cuda.current_stream(device).cuda_stream)


def capturing_on(device: int) -> bool:
    """Is torch's current stream of `device` (where a launch goes) capturing a CUDA graph? Without a device
    switch in the usual case, where `device` is the current one."""
    import torch

    if torch.cuda.current_device() == device:
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()
