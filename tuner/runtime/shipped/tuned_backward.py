"""The tuned backward kernel of a differentiable call: the one the package ships beside the forward entry the call
dispatches to (the forward's rule: the exact tuned problem, else the nearest tuned bucket), loaded once per device,
and its run on the forward's O and lse.

Part of the runtime every export ships (this folder, copied whole). An export records, in each dispatch entry, the
confirmed backward winner of the entry's problem where it beat SDPA's backward (manifest key "backward": kernel,
trial, confirmed µs, ratio to SDPA's best backward), and the kernel itself in the kernels table (pass "backward",
its launch facts under "launch"). A call whose entry has none keeps SDPA's backward (backward.choose_backward).
"""

from typing import Any, Mapping, Optional

import torch

from . import kernels as _kernels
from .backward_kernel import BackwardLauncher, BackwardShape
from .choice import DTYPES, table
from .dispatch import Key
from .launcher import AttentionInputError, GpuUnavailableError

_loaded: dict[tuple[str, int], BackwardLauncher] = {}
_failed: dict[tuple[str, int], str] = {}  # why a backward kernel cannot load on a device, once found


_records: dict[tuple, Optional[Mapping[str, Any]]] = {}  # (dtype, D, causal, H, Hkv, Sq, Sk, B) -> record_for's
CACHE_LIMIT = 4096


def record_for(q: Any, k: Any, causal: bool) -> Optional[Mapping[str, Any]]:
    """The backward record of the dispatch entry a dense call's forward runs (None: the entry has none, no entry
    serves the call, or its cell is routed to SDPA). Reads shapes and dtypes only; remembered per shape (a
    training step asks for every layer)."""
    if q.dtype not in DTYPES or q.dim() != 4 or k.dim() != 4:
        return None
    b, h, sq, d = q.shape
    key = (q.dtype, d, bool(causal), h, k.shape[1], sq, k.shape[2], b)
    if key in _records:
        return _records[key]
    choice = table().choose(Key.of(DTYPES[q.dtype], d, causal, h, k.shape[1], sq, k.shape[2], batch=b))
    record = None if choice is None or choice.route == "sdpa" else choice.entry.get("backward")
    if not (isinstance(record, Mapping) and record.get("kernel") in _kernels.manifest()["kernels"]):
        record = None
    if len(_records) >= CACHE_LIMIT:  # many distinct shapes (ragged lengths): start over
        _records.clear()
    _records[key] = record
    return record


def load_backward(kernel: str, device: int) -> BackwardLauncher:
    """The backward kernel loaded for `device` (once per process and device). One that cannot load there raises
    GpuUnavailableError, remembered (later calls take SDPA's backward without trying again)."""
    # TypeError, KeyError: a bad launch record
    return _kernels.load_once(_loaded, _failed, kernel, device, _load, (RuntimeError, TypeError, KeyError))


def _load(kernel: str, device: int) -> BackwardLauncher:
    meta = _kernels.manifest()["kernels"][kernel]
    cc = torch.cuda.get_device_capability(device)
    need = tuple(meta["min_compute_capability"])
    if cc < need:
        raise GpuUnavailableError(f"{kernel} needs compute capability {need[0]}.{need[1]}+, cuda:{device} has "
                                  f"{cc[0]}.{cc[1]}")
    return BackwardLauncher(_kernels.machine_code(meta, cc), meta["entry"], BackwardShape(**meta["launch"]), device)


def run(kernel: str, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, scale: Optional[float]) -> tuple:
    """dq, dk, dv (like q, k and v; dK and dV summed over each K/V head's group by the kernel itself) by the tuned
    backward `kernel` on the forward's out and lse."""
    launcher = load_backward(kernel, q.get_device())
    if grad_out.stride() != out.stride():  # dO like O (an expanded or transposed gradient: copied once)
        grad_out = torch.empty_like(out).copy_(grad_out)
    try:
        return launcher(q, k, v, out, lse, grad_out, scale)
    except AttentionInputError:  # a layout the kernel cannot read (strides, alignment): contiguous copies
        qc, kc, vc, oc, gc = (t.contiguous() for t in (q, k, v, out, grad_out))
        return launcher(qc, kc, vc, oc, lse, gc, scale)
