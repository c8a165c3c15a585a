"""Launch a compiled attention kernel on torch tensors, on torch's current stream.

Standalone on purpose: this folder imports nothing from `tuner`, so that an
exported kernel package (tuner export) ships it whole and needs only torch
and the NVIDIA driver at run time. The cubin is loaded and launched through
the CUDA driver API (ctypes, cuda_driver.py) in the primary context torch
uses, so kernels read and write torch tensors directly, from any thread, on
the stream torch is using: launches order with the caller's work and CUDA
graphs capture them. One AttentionKernel serves one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .cuda_driver import (  # noqa: F401 - the errors are this module's API too
    AttentionInputError,
    DriverKernel,
    GpuUnavailableError,
    TensorMapEncoder,
    capturing_on,
    libcuda,
    stream_getter,
)
from .fp8 import VTransposer, check_descales, is_fp8, v_transposed_like
from .input_checks import (  # noqa: F401 - the checks are this module's API too
    check_attention_tensors,
    check_packed_inputs,
    check_paged_inputs,
    packed_view,
)

ARG_FORMAT = "PPPPP" + "q" * 12 + "iiif"  # q, k, v, o, lse; 4x3 strides; sq, sk, h_per_kv; scale
# TMA kernels: the 128-byte tensor maps of q, k, v first, each as its global
# address (the map's first 8 bytes) and the other 120 bytes; heads, batch last.
TMA_ARG_FORMAT = "Q120s" * 3 + ARG_FORMAT + "ii"



@dataclass(frozen=True)
class LaunchShape:
    block_m: int
    threads: int
    smem_bytes: int
    tma_swizzle: int = 0  # > 0: the kernel reads q, k, v through TMA tensor maps with boxes this many bytes wide
    tma_kv_rows: int = 0  # rows of a K/V box
    tma_q_rows: int = 0  # rows of a Q box (0: block_m)
    persistent: bool = False  # one CTA per SM loops over the (query tile, head, batch) items
    splits: int = 0  # > 0: a decode kernel, grid (row blocks x splits, Hkv, B) over rows = Sq x group
    workspace: bool = False  # a decode kernel whose splits merge through a global workspace (no cluster)
    descales: bool = False  # the kernel takes q/k/v descale pointers after heads and batch (null unless fp8)
    fp8: bool = False  # e4m3 q, k, v (bf16 out), per-(batch, K/V head) descales, V read transposed (fp8.py)
    kv_fp8: bool = False  # an FP8 KV cache: 16-bit q and out, e4m3 k and v with scales [B, Hkv] (k's, v's descales)
    packed: bool = False  # packed sequences: [total, H, D] tensors and cumulative lengths (AttentionKernel.packed)


def launch_grid(shape: LaunchShape, b: int, h: int, hkv: int, sq: int, sm_count: int) -> tuple[int, int, int]:
    """The grid of a launch: (query tiles, heads, batch); a decode kernel's rows are (query, head of the GQA
    group) pairs, its key splits one cluster per row block, (row blocks x splits, K/V heads, batch); a
    persistent kernel runs one CTA per SM (at most one per work item)."""
    if shape.splits:
        return ((sq * (h // hkv) + shape.block_m - 1) // shape.block_m * shape.splits, hkv, b)
    tiles = (sq + shape.block_m - 1) // shape.block_m
    if shape.persistent:
        return (min(tiles * h * b, sm_count), 1, 1)
    return (tiles, h, b)


def tma_arg_format(kernel: DriverKernel, entry: str, maps: int = 3, rest: str = ARG_FORMAT + "ii") -> str:
    """`maps` tensor maps (Q120s each: split_map) then `rest`, with the padding the compiled kernel expects before
    the maps (default: the forward's TMA_ARG_FORMAT; the backward launcher passes its own).

    The arguments travel as one packed buffer, which must match the kernel's parameter offsets; a
    64-byte aligned tensor map may be placed after padding (48 bytes on sm_90, where parameters start
    at constant-bank offset 0x210). The offsets come from the driver (cuKernelGetParamInfo, CUDA 12.4+).
    """
    if not hasattr(libcuda(), "cuKernelGetParamInfo"):
        raise GpuUnavailableError("TMA kernels need a CUDA 12.4+ driver (cuKernelGetParamInfo is missing)")
    offsets = kernel.param_offsets(maps + 1)  # the tensor maps and the first parameter after them
    first = offsets[0]
    if offsets != [first + 128 * i for i in range(maps + 1)]:
        raise GpuUnavailableError(f"{entry}: unexpected TMA kernel parameter layout {offsets}")
    return (f"{first}x" if first else "") + "Q120s" * maps + rest


def split_map(encoded: bytes) -> tuple[int, bytes]:
    """A 128-byte tensor map as its Q120s fields: the address (its first 8 bytes) and the rest."""
    return int.from_bytes(encoded[:8], "little"), encoded[8:]


def _pointers(descales: Any) -> tuple[int, int, int]:
    """The data pointers of (q_descale, k_descale, v_descale), or nulls (an FP8 cache has no q_descale)."""
    return (0, 0, 0) if descales is None else tuple(0 if t is None else t.data_ptr() for t in descales)


def _bounded_put(cache: dict, key: Any, value: Any) -> Any:
    """cache[key] = value, emptying the cache first once it holds CACHE_LIMIT entries; returns value."""
    if len(cache) >= TensorMapEncoder.CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


class AttentionKernel:
    """A compiled attention variant, loaded and ready to launch on torch tensors (on torch's current stream)."""

    def __init__(self, cubin: bytes, entry: str, shape: LaunchShape, device: int = 0) -> None:
        import torch

        self.entry = entry
        self.shape = shape
        self._device = device
        cluster = 1 if shape.workspace else max(shape.splits, 1)
        self._kernel = DriverKernel(cubin, entry, shape.smem_bytes, ARG_FORMAT, cluster, device)
        self._format = tma_arg_format(self._kernel, entry) if shape.tma_swizzle else ARG_FORMAT
        if shape.descales:
            self._format += "PPP"  # q_descale, k_descale, v_descale (float*, null for 16-bit inputs)
        self._v_transposed = VTransposer(cubin, device) if shape.fp8 else None  # V^T for FP8 P V (fp8.py)
        if shape.splits:  # a decode kernel's last parameters: key lengths (int32*, or null) and the paging
            self._format += "PPii"  # block_table (int32*, null: dense K/V), log2 page_size, pages_per_seq
        if shape.workspace:
            self._format += "PP"  # the split merge's workspace (float*) and arrival counters (int32*)
        if shape.packed:
            self._format += "PP"  # cu_seqlens_q, cu_seqlens_k (int32*)
        self._kernel.use_format(self._format)
        self._merge_buffers: dict[int, tuple[Any, Any]] = {}  # per stream: (workspace, counters)
        self._outgrown: list[tuple[Any, Any]] = []  # replaced or captured buffers a graph may still use
        self._maps = TensorMapEncoder() if shape.tma_swizzle else None
        # Per input layout: the address-free maps of q, k, v, or None (encode every call).
        self._map_cache: dict[tuple, tuple[bytes, bytes, bytes] | None] = {}
        self._fits: dict[tuple, tuple[bool, Any]] = {}  # per input layout: (passes the checks, TMA maps)
        self.registers = self._kernel.registers
        self._block = (shape.threads, 1, 1)
        self._sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        self._stream = stream_getter()

    def __call__(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None,
                 check: bool = True, seq_lens: Any = None, descales: Any = None) -> None:
        """Launch on torch's current stream. Tensors are logical [B, H, S, D] with any strides.

        seq_lens (decode kernels only): int32 [B] on q's device, the keys of each batch row in use
        (k and v hold Sk >= each; read on the GPU, clamped to [0, Sk]; causal aligns to each length).
        descales (FP8 kernels only, required there): an e4m3 kernel's (q_descale, k_descale, v_descale), float32
        [B, Hkv] each (the real inputs are the stored ones times these; out is bfloat16); an FP8 KV cache's
        (None, k_scale, v_scale) (out in q's dtype).
        """
        if check:
            check_attention_tensors(q, k, v, out, lse)
            if seq_lens is not None:
                self._check_seq_lens(q, seq_lens)
            self._check_dtype(q, k, descales)
        self.launch_unchecked(q, k, v, out, lse, scale, seq_lens, descales)

    def _check_dtype(self, q: Any, k: Any, descales: Any) -> None:
        """e4m3 inputs with their descales for an e4m3 kernel, an e4m3 k and v with their scales for an FP8
        cache's; 16-bit ones without, for the others."""
        if is_fp8(q) != self.shape.fp8 or is_fp8(k) != (self.shape.fp8 or self.shape.kv_fp8):
            want = ("float8_e4m3fn q, k and v" if self.shape.fp8 else
                    "float16 or bfloat16 q with float8_e4m3fn k and v" if self.shape.kv_fp8 else
                    "float16 or bfloat16 inputs")
            raise AttentionInputError(f"{self.entry} takes {want} (got q {q.dtype}, k {k.dtype})")
        if self.shape.fp8 or self.shape.kv_fp8:
            check_descales(q, k, descales, kv_only=self.shape.kv_fp8)
        elif descales is not None:
            raise AttentionInputError(f"{self.entry} takes no descales: they scale float8_e4m3fn inputs")

    def _check_seq_lens(self, q: Any, seq_lens: Any) -> None:
        import torch

        if not self.shape.splits:
            raise AttentionInputError(f"{self.entry} takes no seq_lens: per-sequence lengths are a decode kernel's")
        if (not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype != torch.int32 or seq_lens.dim() != 1
                or seq_lens.numel() != q.shape[0] or not seq_lens.is_contiguous()
                or seq_lens.device != q.device):
            raise AttentionInputError(f"seq_lens must be a contiguous int32 tensor of shape ({q.shape[0]},) on "
                                      f"{q.device}")

    def paged(self, q: Any, k_cache: Any, v_cache: Any, out: Any, block_table: Any, seq_lens: Any,
              scale: float | None = None, check: bool = True, descales: Any = None) -> None:
        """Decode kernels: attention over a paged K/V cache (check_paged_inputs: vLLM's layout). Row b
        uses its first seq_lens[b] keys, found through block_table[b]; causal aligns to that length. An FP8
        cache's kernel takes descales=(None, k_scale, v_scale), float32 [B, Hkv]."""
        if check and not self.shape.splits:
            raise AttentionInputError(f"{self.entry} takes no paged cache: paging is a decode kernel's")
        k, v = k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # [pages, Hkv, page_size, D]
        if check:
            check_attention_tensors(q, q, q, out)
            check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens)
            self._check_dtype(q, k, descales)
        self._launch(q, k, v, out, None, scale, q.shape, k.shape, q.stride(), k.stride(), v.stride(),
                     q.data_ptr(), k.data_ptr(), v.data_ptr(), lens=seq_lens.data_ptr(),
                     paging=(block_table.data_ptr(), k.shape[2].bit_length() - 1, block_table.shape[1]),
                     descales=_pointers(descales))

    def packed(self, q: Any, k: Any, v: Any, out: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
               max_seqlen_k: int, scale: float | None = None, check: bool = True, lse: Any = None) -> None:
        """Packed kernels: sequences one after another (FlashAttention's varlen form, check_packed_inputs), q and
        out [total_q, H, D], k and v [total_k, Hkv, D]; sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1
        of q with keys cu_seqlens_k[b] .. of k and v, causal and windows aligned to its own end; lse [H, total_q]."""
        if check:
            if not self.shape.packed:
                raise AttentionInputError(f"{self.entry} takes no packed sequences: a kernel tuned for them does")
            check_packed_inputs(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, lse)
        b = cu_seqlens_q.shape[0] - 1
        if not q.shape[0] * b:
            return
        q4, k4, v4, o4 = packed_view(q), packed_view(k), packed_view(v), packed_view(out)
        self._launch(q4, k4, v4, o4, lse, scale, (b, q.shape[1], max_seqlen_q, q.shape[2]),
                     (b, k.shape[1], max_seqlen_k if k.shape[0] else 0, k.shape[2]), q4.stride(), k4.stride(),
                     v4.stride(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                     packing=(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()))

    def launch_unchecked(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None,
                         seq_lens: Any = None, descales: Any = None) -> None:
        """The launch alone (inputs already validated)."""
        self._launch(q, k, v, out, lse, scale, q.shape, k.shape, q.stride(), k.stride(), v.stride(),
                     q.data_ptr(), k.data_ptr(), v.data_ptr(), lens=seq_lens.data_ptr() if seq_lens is not None else 0,
                     descales=_pointers(descales))

    def launch_if_fit(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None,
                      seq_lens: Any = None, descales: Any = None) -> bool:
        """Launch if q, k, v have a layout that passed check_attention_tensors before (remembered
        per layout: shapes, strides, dtypes, devices) and 16-byte aligned data; otherwise launch
        nothing and return False (the caller then validates fully, for the precise error).

        out must be torch.empty_like(q) (bfloat16 for e4m3 q); lse is not taken here; seq_lens, when given,
        the caller has checked (a decode kernel's int32 [B] on q's device); descales, an e4m3 kernel's,
        too (fp8.check_descales). The cheapest checked launch:
        each tensor attribute is read once (each read is a call into torch, a fraction of a
        microsecond that adds up at small problem sizes).
        """
        qshape, kshape, vshape = q.shape, k.shape, v.shape
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp) & 15 or lse is not None:
            return False
        layout = (qshape, kshape, vshape, qs, ks, vs, q.dtype, k.dtype, v.dtype,
                  q.get_device(), k.get_device(), v.get_device())
        fit = self._fits.get(layout)
        if fit is None:
            fit = self._remember_fit(layout, q, k, v)
        if fit[0]:
            self._launch(q, k, v, out, None, scale, qshape, kshape, qs, ks, vs, qp, kp, vp, fit[1],
                         seq_lens.data_ptr() if seq_lens is not None else 0, descales=_pointers(descales))
        return fit[0]

    def fits(self, q: Any, k: Any, v: Any) -> bool:
        """Whether launch_if_fit would launch q, k, v (their layout passed the checks; data 16-byte aligned)."""
        if (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
            return False
        layout = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
                  q.get_device(), k.get_device(), v.get_device())
        fit = self._fits.get(layout)
        return (fit if fit is not None else self._remember_fit(layout, q, k, v))[0]

    def _remember_fit(self, layout: tuple, q: Any, k: Any, v: Any) -> tuple[bool, Any]:
        """(does the layout pass check_attention_tensors, its address-free TMA maps or None)."""
        import torch

        try:
            check_attention_tensors(q, k, v, q if not is_fp8(q) else q.new_empty(q.shape, dtype=torch.bfloat16))
            fits = (q.get_device() == k.get_device() == v.get_device() and k.shape[2] > 0
                    and is_fp8(q) == self.shape.fp8 and is_fp8(k) == (self.shape.fp8 or self.shape.kv_fp8))
        except AttentionInputError:
            fits = False
        vmap = v_transposed_like(v) if fits and self.shape.fp8 else v  # an e4m3 kernel's V map is V^T's
        maps = self._maps_for(q, k, vmap) if fits and self._maps is not None else None
        return _bounded_put(self._fits, layout, (fits, maps))

    def _launch(self, q: Any, k: Any, v: Any, out: Any, lse: Any, scale: float | None, qshape: Any, kshape: Any,
                qs: Any, ks: Any, vs: Any, qp: int, kp: int, vp: int, tails: Any = False, lens: int = 0,
                paging: tuple[int, int, int] = (0, 0, 0), descales: tuple[int, int, int] = (0, 0, 0),
                packing: tuple[int, int] = (0, 0)) -> None:
        b, h, sq, d = qshape
        hkv, sk = kshape[1], (paging[2] << paging[1] if paging[0] else kshape[2])  # paged: the table's capacity
        if not b * h * sq:
            return  # nothing to compute (a zero grid would not launch)
        maps = self._maps
        if not sk and maps is not None:
            # No keys: TMA cannot map an empty tensor; the result is defined without the kernel.
            out.zero_()
            if lse is not None:
                lse.fill_(-math.inf)
            return
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        os_ = out.stride()
        shape = self.shape
        if shape.fp8:  # V^T, the layout FP8 P V reads (fp8.py); made on this stream, before the kernel
            v = self._v_transposed(v)
            vs, vp = v.stride(), v.data_ptr()
        grid = launch_grid(shape, b, h, hkv, sq, self._sm_count)
        lp = lse.data_ptr() if lse is not None else 0
        if maps is not None:
            # A map depends on the layout (looked up here, unless given) and the address (written per call).
            page = kshape[2] if paging[0] else 0  # a paged cache's K/V boxes stay within a page
            if tails is False:
                key = (qs, ks, vs, q.shape, k.shape, qshape, kshape, q.dtype, k.dtype, page)  # q, k: packed's totals
                tails = self._map_cache.get(key, False)
                if tails is False:
                    tails = _bounded_put(self._map_cache, key, self._maps_for(q, k, v, page))
            if tails is None:  # a driver whose maps are not address + rest: full maps per call
                mq, mk, mv = self._encode_maps(q, k, v, page)
                args = (*split_map(mq), *split_map(mk), *split_map(mv))
            else:
                args = (qp, tails[0], kp, tails[1], vp, tails[2])
            args += (qp, kp, vp, out.data_ptr(), lp, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2],
                     vs[0], vs[1], vs[2], os_[0], os_[1], os_[2], sq, sk, h // hkv, scale, h, b)
            if shape.descales:
                args += descales
        else:
            args = (qp, kp, vp, out.data_ptr(), lp, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2],
                    vs[0], vs[1], vs[2], os_[0], os_[1], os_[2], sq, sk, h // hkv, scale)
        stream = self._stream(self._device)
        if shape.splits:
            args += (lens,) + paging
        if shape.workspace:
            args += self._merge_space(stream, grid, d)
        if shape.packed:
            args += packing
        self._kernel.launch(grid, self._block, args, shape.smem_bytes, stream)

    def _merge_space(self, stream: int, grid: tuple[int, int, int], d: int) -> tuple[int, int]:
        """(workspace, counters) pointers for a launch of `grid` on `stream`: SPLITS partial results of
        BLOCK_M x (D + 2) floats and one arrival counter per row block. Eager launches share them per
        stream (ordered; the last CTA of a row block zeroes its counter), grown by doubling. A launch being
        captured gets its own, allocated (counters zeroed: a memset) in the capture, so graphs never share
        them. Buffers a graph may use are kept as long as this kernel (a few hundred KB a B8 decode step)."""
        import torch

        blocks = grid[0] // self.shape.splits * grid[1] * grid[2]
        floats = blocks * self.shape.splits * self.shape.block_m * (d + 2)
        capturing = capturing_on(self._device)
        have = None if capturing else self._merge_buffers.get(stream)
        if have is None or have[0].numel() < floats or have[1].numel() < blocks:
            if have is not None:
                self._outgrown.append(have)
                floats, blocks = max(floats, 2 * have[0].numel()), max(blocks, 2 * have[1].numel())
            device = torch.device("cuda", self._device)
            have = (torch.empty(max(floats, 4), dtype=torch.float32, device=device),
                    torch.zeros(max(blocks, 1), dtype=torch.int32, device=device))
            if capturing:
                self._outgrown.append(have)
            else:
                self._merge_buffers[stream] = have
        return have[0].data_ptr(), have[1].data_ptr()

    def _map_inputs(self, q: Any, k: Any, v: Any, page: int = 0) -> tuple[tuple[str, Any, int], ...]:
        """(name, tensor, box rows) of each input read through a tensor map. In a paged cache (k is then
        [pages, Hkv, page, D]) a K/V box never crosses a page: min(tile, page) rows."""
        kv_rows = min(self.shape.tma_kv_rows, page) if page else self.shape.tma_kv_rows
        v_rows = v.shape[2] if self.shape.fp8 else kv_rows  # V^T [B, Hkv, D, Sk']: a box is all D rows
        return ("q", q, self.shape.tma_q_rows or self.shape.block_m), ("k", k, kv_rows), ("v", v, v_rows)

    def _encode_maps(self, q: Any, k: Any, v: Any, page: int = 0) -> tuple[bytes, ...]:
        swz = self.shape.tma_swizzle
        return tuple(self._maps.encode(name, t, rows, swz) for name, t, rows in self._map_inputs(q, k, v, page))

    def _maps_for(self, q: Any, k: Any, v: Any, page: int = 0) -> tuple[bytes, ...] | None:
        """The address-free maps of q, k, v's layout (None: this driver needs full maps per call)."""
        swz = self.shape.tma_swizzle
        tails = tuple(self._maps.address_free(name, t, rows, swz) for name, t, rows in self._map_inputs(q, k, v, page))
        return None if None in tails else tails
