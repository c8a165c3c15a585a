"""attention(q, k, v): tuned kernels behind a dispatch cache, a torch.library op and an SDPA fallback.

Part of the runtime every export ships (this folder, copied whole).
Eager calls take the fast path: one dict lookup on a cheap tuple, a few
attribute checks (the layout's are remembered by the kernel) and one driver
launch on torch's current stream, so calls order with the caller's streams and
CUDA graphs capture them. Under torch.compile the call
goes through the registered custom op (with a fake implementation), so the
graph traces; the op's real implementation is the same eager path.
FP8 calls (float8_e4m3fn inputs with their descales) go to fp8_call.py; a 16-bit call never reads a descale.
"""
# No `from __future__ import annotations`: torch.library reads the op's schema from real annotations.

from typing import Any, Callable, Optional

import torch

from . import autograd as _autograd, fp8_cache as _fp8_cache, fp8_call as _fp8, kernels as _kernels, masked as _masked
from . import paged as _paged
from .choice import (DTYPES, FALLBACKS, cell as _cell, check_structure, choose_kernel, refuse_grads,
                     refuse_unscaled_fp8, table)
from .dispatch import NO_MASK, Explanation, Key, mask_text
from .launcher import AttentionInputError, GpuUnavailableError, check_attention_tensors
# _sdpa: SDPA with the kernels' semantics (the GPU tests compare with it)
from .masked import fallback_call as _fallback, sdpa as _sdpa  # noqa: F401
from .explain_lines import choice_lines as _choice_lines
from .seq_lens import check_seq_lens, sdpa_with_lens

# The torch.library namespace: the package's import name (an export's folder, e.g. my_attention; nested names
# joined by "_"), so that two exports in one process register two ops.
PACKAGE: str = __name__.rsplit(".", 2)[0].replace(".", "_")
# (torch dtype, D, causal, H // Hkv, Sq bucket, Sk bucket, B x H bucket, mask) -> (device index, the kernel's
# launch_if_fit, or None: the fallback)
_cache: dict[tuple, tuple[int, Callable[..., bool]]] = {}
# The same cells for calls with seq_lens -> (device index, the decode kernel, or None: masked SDPA)
_lens_cache: dict[tuple, tuple[int, Any]] = {}
NO_WINDOW = (-1, -1)  # the default window_size: a call with this very tuple skips the keyword checks


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, fallback: Optional[str] = None,
              seq_lens: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
              window_size: Any = NO_WINDOW, softcap: Optional[float] = 0.0,
              q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
              v_descale: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
              v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Softmax(q k^T * scale) v for logical [B, H, S, D] CUDA tensors (any strides; BSHD as x.transpose(1, 2)).

    k and v are [B, Hkv, Sk, D] with H % Hkv == 0 (GQA); causal masking is
    aligned bottom-right when Sq != Sk; scale defaults to 1/sqrt(D).
    fallback="sdpa" sends inputs the kernels cannot take to torch's SDPA
    instead of raising AttentionInputError.
    seq_lens (int32 [B] on q's device): batch row b uses only its first seq_lens[b] keys of k and v
    (a static or ragged cache; causal aligns to that length). The decode kernels read the lengths on the
    GPU, so a captured CUDA graph replays with new ones; shapes without a decode kernel run masked SDPA.
    block_table (int32 [B, pages_per_seq], with seq_lens): the paged form. k and v are then caches
    [pages, page_size, Hkv, D] (vLLM's layout; page_size 16 to 256, a power of two) and row b's key n is
    row n % page_size of page block_table[b, n // page_size]. The decode kernels read the pages in
    place; elsewhere the pages are gathered for masked SDPA. Any decode kernel reads any page size and lengths,
    but at the speed of the tiles it was tuned with: a call runs the kernel tuned on its own page size where
    the package has one (on seq_lens, on a ragged batch), else on the nearest (explain() says which).
    window_size (left, right), FlashAttention's sliding window: query i, aligned to the keys' end, sees keys
    i' - left .. i' + right (-1 or None: unbounded; causal: right 0 or -1). softcap > 0 makes the scores
    softcap * tanh(scores / softcap) (Gemma-2). Both are compiled into a kernel: a call runs only a kernel
    tuned with its own window and softcap (prefill or decode); elsewhere (with fallback="sdpa", a routed cell,
    or no kernel of that window and softcap) a window runs SDPA under a boolean mask and a softcap a chunked
    torch implementation.
    FP8: q, k and v torch.float8_e4m3fn with q_descale, k_descale and v_descale (float32 [B, Hkv] each, as
    FlashAttention-3 takes them: real = stored * descale, q's shared by the heads of a GQA group) run the
    package's e4m3 kernel of the cell and return bfloat16. Where none serves the call (as above; and every
    seq_lens or paged call) the fallback runs on the inputs dequantised to bfloat16. 16-bit inputs take no descales.
    An FP8 KV cache (vLLM's): float16 or bfloat16 q with float8_e4m3fn k and v (dense, seq_lens or paged) and
    k_scale, v_scale (float32: one, [Hkv] or [B, Hkv]; real = stored * scale) runs the package's FP8-cache decode
    kernel of the cell and returns q's dtype; elsewhere k and v are dequantised to q's dtype for SDPA.
    """
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        raise AttentionInputError(f"q, k and v must be torch.Tensors (got {type(q).__name__}, {type(k).__name__}, "
                                  f"{type(v).__name__})")
    # The default window is this very tuple: the common call skips the keywords' checks (host time per call).
    plain = window_size is NO_WINDOW and (softcap is None or (type(softcap) in (int, float) and softcap == 0))
    if not plain:
        causal, mask = _masked.causal_form(causal, _masked.call_mask(window_size, softcap, causal))
    else:
        mask = NO_MASK
    if torch.compiler.is_compiling():
        dense = (seq_lens is None and block_table is None and q_descale is None and k_descale is None
                 and v_descale is None and k_scale is None and v_scale is None)
        if _autograd.compiled_with_grad(q, k, v, mask, dense):  # a training step: the differentiable op
            return _autograd.compiled_call(q, k, v, causal, scale)
        return _op(q, k, v, causal, scale, fallback, seq_lens, block_table, *mask, q_descale, k_descale, v_descale,
                   k_scale, v_scale)
    if (q_descale is None and k_descale is None and v_descale is None and k_scale is None and v_scale is None
            and k.dtype is not _fp8.FP8 and v.dtype is not _fp8.FP8):  # a 16-bit call (the common one): no tuples
        return _eager(q, k, v, causal, scale, fallback, seq_lens, block_table, mask)
    return _call(q, k, v, causal, scale, fallback, seq_lens, block_table, mask, (q_descale, k_descale, v_descale),
                 (k_scale, v_scale))


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
          fallback: Optional[str], seq_lens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
          mask: tuple, descales: tuple, scales: tuple) -> torch.Tensor:
    """The form of a call (also the custom op's implementation): an FP8 KV cache (k_scale, v_scale; or fp8 k or v
    with 16-bit q), FP8 (descales), 16-bit (_eager)."""
    if scales != (None, None) or _fp8_cache.is_fp8_cache(q, k, v):
        if descales != (None, None, None):
            raise AttentionInputError("an FP8 KV cache takes k_scale and v_scale, not q/k/v descales (those scale "
                                      "float8_e4m3fn q, k and v)")
        return _fp8_cache.forward(q, k, v, causal, scale, fallback, seq_lens, block_table, mask, *scales)
    if descales == (None, None, None):
        return _eager(q, k, v, causal, scale, fallback, seq_lens, block_table, mask)
    return _fp8.forward(q, k, v, causal, scale, fallback, seq_lens, block_table, mask, descales)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
           fallback: Optional[str], seq_lens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
           mask: tuple = NO_MASK) -> torch.Tensor:
    """A 16-bit call in each form (dense, seq_lens, paged); `mask` is the checked call_mask()."""
    if block_table is not None:
        return _paged.forward_paged(q, k, v, causal, scale, fallback, seq_lens, block_table, mask)
    if seq_lens is not None:
        return _forward_lens(q, k, v, causal, scale, fallback, seq_lens, mask)
    return _forward(q, k, v, causal, scale, fallback, mask)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
             fallback: Optional[str], mask: tuple) -> torch.Tensor:
    qs, ks = q.shape, k.shape
    if len(qs) == 4 and len(ks) == 4 and ks[1] and ks[2] and qs[2]:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            if fallback in FALLBACKS and mask == NO_MASK and _autograd.serves(q, k, v, causal):
                return _autograd.attention_with_grad(q, k, v, causal, scale)  # tuned forward, backward on its lse
            return _slow(q, k, v, causal, scale, fallback, mask)  # SDPA for the whole call (or an error)
        hit = _cache.get(_cell(q.dtype, qs, ks, causal, mask))
        if hit is not None and (fallback is None or fallback == "sdpa") and q.get_device() == hit[0]:
            if hit[1] is None:  # a cell routed to SDPA: its kernel measured slower there
                check_structure(q, k, v)  # a cell holds other shapes too: what the slow path refuses, refused
                return _fallback(q, k, v, causal, scale, mask)
            out = torch.empty_like(q)
            if hit[1](q, k, v, out, None, scale):  # the kernel checks the rest (layout cached); torch's stream
                return out
    return _slow(q, k, v, causal, scale, fallback, mask)


def _forward_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                  fallback: Optional[str], seq_lens: torch.Tensor, mask: tuple) -> torch.Tensor:
    qs, ks = q.shape, k.shape
    hit = None
    if len(qs) == 4 and len(ks) == 4 and ks[1] and ks[2] and qs[2]:
        hit = _lens_cache.get(_cell(q.dtype, qs, ks, causal, mask))
    if hit is None or fallback not in FALLBACKS or q.get_device() != hit[0] \
            or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _slow_lens(q, k, v, causal, scale, fallback, seq_lens, mask)
    check_seq_lens(q, seq_lens)
    if hit[1] is None:
        check_structure(q, k, v)
        return sdpa_with_lens(q, k, v, causal, scale, seq_lens, mask)
    out = torch.empty_like(q)
    if hit[1].launch_if_fit(q, k, v, out, None, scale, seq_lens):
        return out
    return _slow_lens(q, k, v, causal, scale, fallback, seq_lens, mask)


def _slow_lens(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], fallback: Optional[str],
               seq_lens: Any, mask: tuple) -> torch.Tensor:
    """Validate fully, choose the decode kernel (or masked SDPA) and fill the seq_lens dispatch cache."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    refuse_unscaled_fp8(q, k, v)
    check_structure(q, k, v)
    if q.dim() == 4:
        check_seq_lens(q, seq_lens)
    try:
        kernel = _choose(q, k, v, causal, mask, seq_lens=True)
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa" and q.dim() == 4:  # seq_lens checked above
            return sdpa_with_lens(q, k, v, causal, scale, seq_lens, mask)
        raise
    if kernel is not None and not kernel.shape.splits:
        kernel = None  # only the decode kernels take seq_lens: this cell runs masked SDPA, as a routed one does
    _lens_cache[_cell(q.dtype, q.shape, k.shape, causal, mask)] = (q.get_device(), kernel)
    if kernel is None:  # a cell routed to SDPA, or without a decode kernel
        return sdpa_with_lens(q, k, v, causal, scale, seq_lens, mask)
    out = torch.empty_like(q)
    kernel.launch_unchecked(q, k, v, out, None, scale, seq_lens)
    return out


def _slow(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], fallback: Optional[str],
          mask: tuple) -> torch.Tensor:
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    refuse_unscaled_fp8(q, k, v)
    check_structure(q, k, v)
    try:
        kernel = _resolve(q, k, v, causal, mask)
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa":
            return _fallback(q, k, v, causal, scale, mask)
        raise
    if kernel is None:  # routed to SDPA
        return _fallback(q, k, v, causal, scale, mask)
    if q.numel() == 0:
        return torch.empty_like(q)
    out = torch.empty_like(q)
    kernel.launch_unchecked(q, k, v, out, None, scale)
    return out


def _key(q: torch.Tensor, k: torch.Tensor, causal: bool, mask: tuple = NO_MASK, seq_lens: bool = False) -> Key:
    """The dispatch key of a dense call (`seq_lens`: it passes per-row key lengths)."""
    b, h, sq, d = q.shape
    return Key.of(DTYPES[q.dtype], d, causal, h, k.shape[1], sq, k.shape[2], batch=b, mask=mask, seq_lens=seq_lens)


def _choose(q: Any, k: Any, v: Any, causal: bool, mask: tuple, seq_lens: bool = False) -> Any:
    """Validate fully, choose the kernel of the call's key and load it: an AttentionKernel, or None for a cell
    routed to SDPA (`seq_lens`: the call passes per-row key lengths)."""
    check_attention_tensors(q, k, v, q)  # q stands in for out: empty_like(q) has its shape and layout
    refuse_grads(q, k, v)
    if k.shape[2] == 0:
        raise AttentionInputError("k and v must have at least one key (Sk = 0)")
    return choose_kernel(q, _key(q, k, causal, mask, seq_lens))


def _resolve(q: Any, k: Any, v: Any, causal: bool, mask: tuple) -> Any:
    """_choose for a call without lengths, remembered in the dispatch cache."""
    kernel = _choose(q, k, v, causal, mask)
    _cache[_cell(q.dtype, q.shape, k.shape, causal, mask)] = (q.get_device(), kernel.launch_if_fit if kernel else None)
    return kernel


@torch.library.custom_op(f"{PACKAGE}::attention", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
        fallback: Optional[str], seq_lens: Optional[torch.Tensor] = None,
        block_table: Optional[torch.Tensor] = None, window_left: int = -1, window_right: int = -1,
        softcap: float = 0.0, q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
        v_descale: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
        v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _call(q, k, v, causal, scale, fallback, seq_lens, block_table, (window_left, window_right, softcap),
                 (q_descale, k_descale, v_descale), (k_scale, v_scale))


@torch.library.register_fake(f"{PACKAGE}::attention")
def _op_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
             fallback: Optional[str], seq_lens: Optional[torch.Tensor] = None,
             block_table: Optional[torch.Tensor] = None, window_left: int = -1, window_right: int = -1,
             softcap: float = 0.0, q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
             v_descale: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
             v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    if q.dtype == torch.float8_e4m3fn:  # an FP8 call returns bfloat16, laid out like q
        return torch.empty_like(q, dtype=torch.bfloat16)
    return torch.empty_like(q)


def _device_cc(q: Any) -> Optional[tuple[int, int]]:
    if not torch.cuda.is_available():
        return None
    device = q.get_device() if isinstance(q, torch.Tensor) and q.is_cuda else torch.cuda.current_device()
    return torch.cuda.get_device_capability(device)


def explain(q: Any, k: Any, v: Any, *, causal: bool = False, window_size: Any = NO_WINDOW,
            softcap: Optional[float] = 0.0, seq_lens: Any = None, block_table: Any = None, q_descale: Any = None,
            k_descale: Any = None, v_descale: Any = None, k_scale: Any = None, v_scale: Any = None) -> Explanation:
    """Which kernel attention(q, k, v, causal=..., window_size=..., softcap=..., seq_lens=..., block_table=...,
    q_descale=..., ..., k_scale=..., v_scale=...) would run, and why (print() it); where q, k or v requires grad, also
    which backward (backward.choose_backward). Needs no GPU."""
    paged = block_table is not None
    fp8 = isinstance(q, torch.Tensor) and q.dtype == _fp8.FP8 and q.dim() > 0
    cache = _fp8_cache.is_fp8_cache(q, k, v) or k_scale is not None or v_scale is not None
    errors = _form_errors(q, k, v, fp8, seq_lens, block_table)  # every limit the inputs break, the device's first
    descales = None if q_descale is None and k_descale is None and v_descale is None else \
        (q_descale, k_descale, v_descale)
    per_head = paged and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (k, v))  # a cache's Hkv: dim 2
    if cache:
        errors += _fp8_cache.scale_errors(q, k, v, k_scale, v_scale, paged)
    else:
        errors += _fp8.descale_errors(q, *((k.transpose(1, 2), v.transpose(1, 2)) if per_head else (k, v)), descales)
    try:
        causal, mask = _masked.causal_form(causal, _masked.call_mask(window_size, softcap, causal))
    except AttentionInputError as exc:
        errors.append(str(exc))
        mask = NO_MASK
    form = "".join(f", {n}={tuple(getattr(t, 'shape', ()))}"
                   for n, t in (("seq_lens", seq_lens), ("block_table", block_table)) if t is not None)
    shapes = (f"q {tuple(getattr(q, 'shape', ()))}, k {tuple(getattr(k, 'shape', ()))}, "
              f"v {tuple(getattr(v, 'shape', ()))}, {getattr(q, 'dtype', '?')}, causal={bool(causal)}"
              + ("" if mask == NO_MASK else f", {mask_text(mask)}") + form)
    lines = [f"{PACKAGE}.attention({shapes})"]
    choice = None
    errors += _shape_errors(q, k, v, cache)
    key = _call_key(q, k, causal, mask, seq_lens, block_table, cache)
    if key is not None:
        lines.append(f"  dispatch key: {key.label()}")
        choice = table().choose(key)
        if choice is None:
            errors.append(table().unsupported_reason(key))
    code = "none"
    # what an FP8 call's fallback runs on, and what its kernel takes
    inputs = f" {_fp8.DEQUANTISED}" if fp8 else " on k and v dequantised to q's dtype" if cache else ""
    takes = ("e4m3: the kernel takes q, k, v as float8_e4m3fn with their descales and writes bfloat16" if fp8 else
             "FP8 KV cache: the kernel reads k and v as float8_e4m3fn with k_scale and v_scale and writes q's dtype"
             if cache else "")
    if choice is not None:
        code = _kernels.code_source(choice.entry["kernel"], _device_cc(q))
        lines += (_choice_lines(choice, mask, inputs, takes) + [f"  code: {code}"]
                  + _lens_lines(choice, fp8, seq_lens, paged))
    error = "; ".join(errors) or None
    if error:
        lines.append(f"  error: {error} (fallback='sdpa' would run {_masked.fallback_name(mask)}{inputs} instead)")
    if _autograd.needs_grad(q, k, v):  # a training call: which backward runs on the forward's O and lse
        form = "paged" if paged else "seq_lens" if seq_lens is not None else "fp8" if fp8 else \
            "fp8_cache" if cache else "dense"
        lines.append(_autograd.backward_line(q, k, causal, mask, form, choice, error, _device_cc(q)))
    return Explanation(choice.entry["kernel"] if choice else None, choice.entry["trial_id"] if choice else None,
                       bool(choice and choice.exact), choice.reason if choice else (error or ""), code, error,
                       "\n".join(lines))


def _form_errors(q: Any, k: Any, v: Any, fp8: bool, seq_lens: Any, block_table: Any) -> list[str]:
    """The first limit the call breaks in its form (attention()'s checks): dense, with seq_lens, or paged."""
    try:
        if block_table is None:
            check_attention_tensors(q, k, v, _fp8.bf16_out_like(q) if fp8 else q)  # FP8 calls write bfloat16
            if seq_lens is not None:
                check_seq_lens(q, seq_lens)
        elif seq_lens is None or not all(isinstance(t, torch.Tensor) for t in (q, k, v, block_table, seq_lens)):
            raise AttentionInputError("a paged call needs q, k_cache, v_cache, block_table and seq_lens tensors")
        elif q.dim() == 4 and k.dim() == 4:  # other ranks: _shape_errors names them
            _paged.check_paged_structure(q, k, v, block_table, seq_lens)
            _paged.check_paged_kernel_inputs(q, k, v, block_table, seq_lens)
    except AttentionInputError as exc:
        return [str(exc)]
    return []


def _call_key(q: Any, k: Any, causal: bool, mask: tuple, seq_lens: Any, block_table: Any,
              cache: bool = False) -> Optional[Key]:
    """The dispatch key of the call (dense, with seq_lens, or paged: k a cache; `cache`: an FP8 KV cache's),
    None where its shapes give none."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 and k.dim() == 4
            and q.dtype in DTYPES):
        return None
    paged = isinstance(block_table, torch.Tensor) and block_table.dim() == 2
    heads_kv = k.shape[2] if paged else k.shape[1]
    if heads_kv == 0 or q.shape[1] % heads_kv or (block_table is not None and not paged):
        return None
    key = _paged.paged_key(q, k, block_table, causal, mask) if paged else _key(q, k, causal, mask,
                                                                              seq_lens is not None)
    return _fp8_cache.as_cache_key(key) if cache else key


def _lens_lines(choice: Any, fp8: bool, seq_lens: Any, paged: bool) -> list[str]:
    """For a call with seq_lens or pages: where the chosen kernel cannot read them, what runs instead."""
    if choice.route == "sdpa" or (seq_lens is None and not paged):
        return []
    what = "pages" if paged else "per-row key lengths"
    instead = "masked SDPA runs" + (" on the gathered pages" if paged else "")
    if fp8:
        return [f"  {what}: no decode kernel takes e4m3, so {instead} {_fp8.DEQUANTISED}"]
    if not _kernels.manifest()["kernels"][choice.entry["kernel"]]["launch"].get("splits"):
        return [f"  {what}: only decode kernels read them, and this one is not, so {instead}"]
    return []


def _shape_errors(q: Any, k: Any, v: Any, cache: bool = False) -> list[str]:
    """The limits check_attention_tensors did not get to (it stops at the first: the device, on a CPU); `cache`:
    an FP8 KV-cache call (its dtypes: scale_errors)."""
    errors = []
    tensors = [(n, t) for n, t in (("q", q), ("k", k), ("v", v)) if isinstance(t, torch.Tensor)]
    errors += [f"{n} must have rank 4 [B, H, S, D] (got shape {tuple(t.shape)})" for n, t in tensors if t.dim() != 4]
    if len({t.dtype for _, t in tensors}) > 1 and not cache:
        errors.append(f"q, k and v must have one dtype (got {', '.join(str(t.dtype) for _, t in tensors)})")
    if isinstance(q, torch.Tensor) and q.dtype not in DTYPES:
        errors.append(f"dtype {q.dtype} is not supported: the kernels take float16 or bfloat16, or float8_e4m3fn "
                      f"with descales ({table().describe()})")
    return errors


attention.explain = explain  # type: ignore[attr-defined]
