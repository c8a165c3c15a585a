"""Launch a compiled attention backward variant (a template with pass = "backward": attn_bwd_mma, attn_bwd_wgmma)
on torch tensors: dQ, dK and dV from q, k, v, the forward's output and log-sum-exp, and dO. Torch and the driver
alone (the one implementation: the tuner's tuner.runtime.backward_launch.BackwardKernel is a layer over it).

Part of the runtime every export ships (this folder, copied whole). The three kernels run in order on torch's
current stream: <name>_dot_do_o (delta = rowsum(dO * O), lse in log2 units, dQ's fp32 accumulator zeroed),
<name> (dK, dV; dQ accumulated with fp32 atomics) and <name>_dq_convert. lse is what the forward templates write:
float32 [B, H, Sq], natural log, -inf for a row that sees no key. GQA: the kernel sums each K/V head's group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .cuda_driver import DriverKernel, TensorMapEncoder, capturing_on, stream_getter
from .dtypes import ELEMENTS
from .input_checks import AttentionInputError, check_attention_tensors, check_strides
from .launcher import split_map, tma_arg_format

# The parameter list every entry point takes (ATTN_BWD_PARAMS, kernel_templates/attn_bwd_mma/args.h): q, k, v, o,
# dout, lse, lse_log2, delta, dq_accum, dq, dk, dv; 8 x 3 strides (q, k, v, o, do, dq, dk, dv); sq, sk, heads,
# h_per_kv; scale.
ARG_FORMAT = "P" * 12 + "q" * 24 + "iiii" + "f"
TMA_MAPS = 2  # q and do
TMA_SWIZZLE = 128


@dataclass(frozen=True)
class BackwardShape:
    """What a launch needs beyond the cubin: the variant's compiled dtype and head dim, its key tile (BLOCK_N), and
    its template's resources (tuner.kernels.feasibility.resources): threads and dynamic shared memory of the main
    kernel, threads and query rows per block of the two row kernels, the row padding of the lse / delta
    workspaces, the rows of the q / dO TMA boxes (0: no tensor maps) and whether dQ's accumulator is in 64 x 64
    blocks."""

    dtype: str
    head_dim: int
    block_n: int
    threads: int
    smem_bytes: int
    aux_threads: int
    aux_rows: int
    lse_row_pad: int
    tma_rows: int = 0
    dq_tiled: bool = False


class BackwardLauncher:
    """A backward variant's three kernels, loaded on `device` and ready to launch on torch tensors."""

    def __init__(self, cubin: bytes, entry: str, shape: BackwardShape, device: int = 0) -> None:
        self.entry, self.shape, self._device = entry, shape, device
        entries = (entry, f"{entry}_dot_do_o", f"{entry}_dq_convert")
        kernels = [DriverKernel(cubin, name, smem, ARG_FORMAT, 1, device)
                   for name, smem in zip(entries, (shape.smem_bytes, 0, 0))]
        self._maps = TensorMapEncoder() if shape.tma_rows else None
        if self._maps is not None:  # a template with `tma_rows` takes TMA maps of q and do first, in all three
            for kernel, name in zip(kernels, entries):
                kernel.use_format(tma_arg_format(kernel, name, TMA_MAPS, ARG_FORMAT))
        self._main, self._pre, self._convert = kernels
        self.registers = self._main.registers
        self._stream = stream_getter()
        self._workspaces: dict[int, tuple[Any, Any]] = {}  # per stream: flat float32 buffers, grown to the largest
        self._captured: list[tuple[Any, Any]] = []  # workspaces of captured launches: a graph replays into them

    def __call__(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, scale: float | None = None,
                 grads: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        """dq, dk, dv (laid out like q, k and v, or written into `grads`) for logical [B, H, S, D] tensors with any
        strides whose head dim is contiguous; k and v [B, Hkv, Sk, D] (GQA: H a multiple of Hkv). Eager calls share
        one workspace per stream (their launches are ordered there), grown to the largest call's: no allocation on
        repeated calls, and the memory of one call's, whatever the mix of shapes. A launch being captured in a CUDA
        graph gets its own, allocated in the capture and kept alive as long as this launcher (the graph replays
        into it)."""
        dq, dk, dv = self._checked(q, k, v, o, lse, do, grads)
        if q.shape[0] * q.shape[1] * q.shape[2] == 0 or k.shape[2] == 0:
            return dq.zero_(), dk.zero_(), dv.zero_()
        device = self._device_of(q)
        if capturing_on(device):
            space = self._allocate(q)
            self._captured.append(space)
        else:
            space = self._shared(q, self._stream(device))
        self._prepared(q, k, v, o, lse, do, scale, (dq, dk, dv), space)()
        return dq, dk, dv

    def launcher(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, scale: float | None = None,
                 grads: tuple[Any, Any, Any] | None = None) -> Callable[[], tuple[Any, Any, Any]]:
        """The three launches on these tensors, checked and their workspaces allocated once, here: a call of the
        result launches them alone (what a trial times) and returns dq, dk, dv. Each call's first kernel
        recomputes lse_log2 and delta and zeroes dQ's accumulator, so the workspaces are reused."""
        dq, dk, dv = self._checked(q, k, v, o, lse, do, grads)
        if q.shape[0] * q.shape[1] * q.shape[2] == 0 or k.shape[2] == 0:
            return lambda: (dq.zero_(), dk.zero_(), dv.zero_())
        return self._prepared(q, k, v, o, lse, do, scale, (dq, dk, dv), self._allocate(q))

    def _checked(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any,
                 grads: tuple[Any, Any, Any] | None) -> tuple[Any, Any, Any]:
        """The inputs checked; dq, dk, dv (`grads`, checked, or new tensors like q, k and v)."""
        import torch

        check_attention_tensors(q, k, v, o, lse)
        if lse is None:
            raise AttentionInputError("the backward needs the forward's lse (float32 [B, H, Sq])")
        want = getattr(torch, ELEMENTS[self.shape.dtype]["torch"])
        if q.shape[3] != self.shape.head_dim or q.dtype != want:
            raise AttentionInputError(f"{self.entry} takes {self.shape.dtype} of head dim {self.shape.head_dim} "
                                      f"(got q {tuple(q.shape)} {q.dtype})")
        dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        for name, t, like, what in (("do", do, q, "q"), ("dq", dq, q, "q"), ("dk", dk, k, "k"), ("dv", dv, v, "v")):
            if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype or t.device != like.device:
                raise AttentionInputError(f"{name} must be like {what} ({tuple(like.shape)} {like.dtype}), got "
                                          f"{tuple(t.shape)} {t.dtype}")
            check_strides(name, t)
        return dq, dk, dv

    def _sizes(self, q: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of (lse_log2 and delta: float32 [2, B, H, Sq padded], dQ's fp32 accumulator: [B, H, Sq, D], or
        in 64 x 64 blocks over the padded rows where the manifest's dq_tiled says so)."""
        b, h, sq, d = q.shape
        pad = self.shape.lse_row_pad
        sq_pad = -(-sq // pad) * pad
        return (2, b, h, sq_pad), (b, h, sq_pad if self.shape.dq_tiled else sq, d)

    def _allocate(self, q: Any) -> tuple[Any, Any]:
        import torch

        return tuple(torch.empty(s, device=q.device, dtype=torch.float32) for s in self._sizes(q))  # type: ignore

    def _shared(self, q: Any, stream: int) -> tuple[Any, Any]:
        """Views of this stream's flat workspace buffers, which are replaced by larger ones when a call needs more
        (a replaced buffer's memory returns to torch's allocator, stream-ordered: launches queued on this stream
        finish with it before anything else there reuses it)."""
        import torch

        sizes = self._sizes(q)
        have = self._workspaces.get(stream)
        if have is None or any(buf.numel() < math.prod(s) for buf, s in zip(have, sizes)):
            have = tuple(torch.empty(max(math.prod(s), buf.numel() if have else 0), device=q.device,
                                     dtype=torch.float32) for s, buf in zip(sizes, have or (None, None)))
            self._workspaces[stream] = have
        return tuple(buf[:math.prod(s)].view(s) for buf, s in zip(have, sizes))  # type: ignore[return-value]

    def _device_of(self, q: Any) -> int:
        return q.device.index if q.device.index is not None else self._device

    def _prepared(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, scale: Optional[float],
                  grads: tuple[Any, Any, Any], space: tuple[Any, Any]) -> Callable[[], tuple[Any, Any, Any]]:
        """The three launches on checked, non-empty inputs with their workspaces (the argument packing: one
        place)."""
        scratch, dq_accum = space
        dq, dk, dv = grads
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        maps = () if self._maps is None else tuple(
            m for name, t in (("q", q), ("do", do))
            for m in split_map(self._maps.encode(name, t, self.shape.tma_rows, TMA_SWIZZLE)))
        args = maps + (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(), lse.data_ptr(),
                       scratch[0].data_ptr(), scratch[1].data_ptr(), dq_accum.data_ptr(), dq.data_ptr(),
                       dk.data_ptr(), dv.data_ptr(), *(s for t in (q, k, v, o, do, dq, dk, dv) for s in t.stride()[:3]),
                       sq, sk, h, h // hkv, scale)
        device, shape = self._device_of(q), self.shape
        aux_block, main_grid = (shape.aux_threads, 1, 1), (-(-sk // shape.block_n), hkv, b)
        pre_grid, convert_grid = (scratch.shape[3] // shape.aux_rows, h, b), (-(-sq // shape.aux_rows), h, b)

        def launch() -> tuple[Any, Any, Any]:
            stream = self._stream(device)  # torch's current stream at each call
            self._pre.launch(pre_grid, aux_block, args, 0, stream)
            self._main.launch(main_grid, (shape.threads, 1, 1), args, shape.smem_bytes, stream)
            self._convert.launch(convert_grid, aux_block, args, 0, stream)
            return dq, dk, dv

        launch.keep = space  # type: ignore[attr-defined]  # alive while the launcher is
        return launch
