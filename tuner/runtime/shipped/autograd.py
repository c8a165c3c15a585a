"""attention() when q, k or v requires grad: the tuned forward kernel writes O and lse, the backward runs on them.

Part of the runtime every export ships (this folder, copied whole). The path serves dense 16-bit calls without a
window or softcap whose cell has a tuned forward kernel (not routed to SDPA) and a backward that runs on this device
(backward.choose_backward: the package's tuned backward kernel for the call's dispatch entry where it ships one,
else SDPA's cuDNN or flash backward); every other call keeps what attention() did before: SDPA for the whole call with
fallback="sdpa", an AttentionInputError without. Eager calls go through TunedAttention (an autograd Function).
Under torch.compile, dense 16-bit calls without window or softcap whose inputs require grad go through the custom
ops PACKAGE::attention_train (forward: out and lse) and PACKAGE::attention_train_backward, with fake
implementations and a registered autograd formula, so a compiled training step does not break its graph; the
choice is made when the op runs: the tuned forward where it serves (as above), else SDPA's flash forward, and the
backward on either's O and lse (compiled training needs an sm_80+ card and a head dim that is a multiple of 8). Nothing here syncs with the host or allocates outside torch's caching
allocator: a CUDA graph captures forward and backward (after an eager warm-up step, as capture wants anyway).
"""
# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.

from typing import Any, Optional

import torch

from . import backward as _backward, tuned_backward as _tuned
from .choice import DTYPES, check_structure, choose_kernel
from .dispatch import NO_MASK, Key
from .input_checks import check_attention_tensors
from .launcher import AttentionInputError, GpuUnavailableError

PACKAGE: str = __name__.rsplit(".", 2)[0].replace(".", "_")
# (device, dtype, D, causal, H, Hkv, Sq, Sk, B) -> the loaded kernel, or a string: why the tuned forward cannot serve
_kernels: dict[tuple, Any] = {}
CACHE_LIMIT = 4096


def needs_grad(q: Any, k: Any, v: Any) -> bool:
    """Whether autograd records the call (read while tracing too: no generator, dynamo-friendly)."""
    return torch.is_grad_enabled() and ((isinstance(q, torch.Tensor) and q.requires_grad)
                                        or (isinstance(k, torch.Tensor) and k.requires_grad)
                                        or (isinstance(v, torch.Tensor) and v.requires_grad))


def forward_kernel(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """The loaded tuned forward kernel of a dense 16-bit call without window or softcap, or a string saying why the
    tuned forward cannot serve it. Reads shapes, dtypes and strides only (torch.compile's fake tensors too)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) or q.dtype not in DTYPES:
        return "the inputs are not 16-bit rank-4 tensors"
    key = (q.device, q.dtype, q.shape[3], bool(causal), q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[0])
    hit = _kernels.get(key)
    if hit is None:
        if len(_kernels) >= CACHE_LIMIT:  # many distinct shapes (a training loop's ragged lengths): start over
            _kernels.clear()
        hit = _kernels[key] = _load(q, k, v, causal)
    return hit


def _load(q: Any, k: Any, v: Any, causal: bool) -> Any:
    try:
        check_structure(q, k, v)
        if not q.is_cuda or k.dtype != q.dtype or v.dtype != q.dtype or k.shape[2] == 0 or q.numel() == 0:
            return "the inputs are not non-empty CUDA tensors of one dtype"
        b, h, sq, d = q.shape
        kernel = choose_kernel(q, Key.of(DTYPES[q.dtype], d, causal, h, k.shape[1], sq, k.shape[2], batch=b))
    except (AttentionInputError, GpuUnavailableError) as exc:
        return f"no tuned forward kernel serves the call ({exc})"
    if kernel is None:
        return "the call's cell is routed to SDPA (its tuned kernel measured slower there)"
    if kernel.shape.fp8 or kernel.shape.kv_fp8 or kernel.shape.packed:
        return "the cell's kernel is not a 16-bit dense one"
    return kernel


def serves(q: Any, k: Any, v: Any, causal: bool, mask: tuple = NO_MASK) -> bool:
    """Whether a call whose inputs require grad takes the differentiable tuned path (else SDPA, as before)."""
    if mask != NO_MASK or isinstance(forward_kernel(q, k, v, causal), str):
        return False
    return _backward.device_backward(q, causal, k).kind != _backward.SDPA


def _forward(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float]) -> tuple:
    """(out, lse) of the tuned kernel; inputs in a layout it cannot read (misaligned, odd strides) are copied to
    contiguous ones first (their gradients are those of the originals); out is laid out as empty_like(q) always
    (what torch's own SDPA gives, what the fake implementation promises, what cuDNN's cached graphs assume)."""
    qc, kc, vc = q, k, v
    if not kernel.fits(q, k, v):
        qc, kc, vc = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
        check_attention_tensors(qc, kc, vc, qc)
        if not kernel.fits(qc, kc, vc):
            raise AttentionInputError(f"{kernel.entry} cannot read these inputs, even copied contiguous")
    out = torch.empty_like(qc)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    kernel.launch_unchecked(qc, kc, vc, out, lse, scale)
    return _like(out, q), lse


def _backward_of(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: Optional[float]) -> tuple:
    choice = _backward.device_backward(q, causal, k)
    if choice.kind == _backward.TUNED:  # dK and dV of K/V's own heads: the kernel sums each GQA group
        return _tuned.run(str(choice.kernel), grad_out, q, k, v, out, lse, scale)
    if choice.kind == _backward.SDPA:  # compiled calls check the head dim; this is a pre-sm_80 card
        raise GpuUnavailableError("SDPA's flash backward does not run on this device (compute capability 8.0+)")
    return _backward.run_backward(choice.kind, grad_out, q, k, v, out, lse, causal, scale)


class TunedAttention(torch.autograd.Function):
    """The eager differentiable call: forward by the tuned kernel (O and lse saved), backward by backward.py's
    choice on them (no recomputation)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: Any, causal: bool,
                scale: Optional[float]) -> torch.Tensor:
        out, lse = _forward(kernel, q, k, v, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward_of(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def attention_with_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        scale: Optional[float]) -> torch.Tensor:
    """The eager differentiable call (serves() said yes)."""
    return TunedAttention.apply(q, k, v, forward_kernel(q, k, v, causal), causal, scale)


def compiled_with_grad(q: Any, k: Any, v: Any, mask: tuple, dense: bool) -> bool:
    """Under torch.compile (read while tracing: shapes, dtypes and flags only): whether a call goes through the
    differentiable op PACKAGE::attention_train. `dense`: no seq_lens, pages, descales or scales."""
    return (dense and mask == NO_MASK and needs_grad(q, k, v) and q.is_cuda and q.dim() == 4 and k.dim() == 4
            and v.dim() == 4 and q.dtype in DTYPES and k.dtype == q.dtype and v.dtype == q.dtype
            and q.shape[3] % 8 == 0 and q.shape[3] <= _backward.FLASH_MAX_HEAD_DIM)


def compiled_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: Optional[float]) -> torch.Tensor:
    """The differentiable call under torch.compile (compiled_with_grad said yes)."""
    return _train_op(q, k, v, causal, scale)[0]


def backward_line(q: Any, k: Any, causal: bool, mask: tuple, form: str, choice: Any, error: Optional[str],
                  cc: Optional[tuple[int, int]]) -> str:
    """explain()'s line on the backward of a call whose inputs require grad (`choice`: the dispatch table's,
    `error`: what attention() would raise, `cc`: the device's capability, None without one)."""
    # Inputs off the GPU (explain() on a machine without one): the rule is named, not the device's error.
    error = "; ".join(p for p in (error or "").split("; ") if p and "must be a CUDA tensor" not in p)
    forward = (f"the tuned forward cannot take the call ({error})" if error else
               "no tuned forward kernel has the call's key" if choice is None else
               "the call's cell is routed to SDPA (its tuned kernel measured slower there)"
               if choice.route == "sdpa" else None)
    if forward is None and form == "dense" and mask == NO_MASK and cc is not None and q.is_cuda:
        return "  " + _backward.device_backward(q, causal, k).text()
    dims = q.shape if isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(k, torch.Tensor) else None
    return "  " + _backward.choose_backward(
        head_dim=dims[3] if dims else 0, causal=causal, seq_q=dims[2] if dims else 0,
        seq_k=k.shape[-2] if dims else 0, mask=mask, form=form, forward=forward or (None if dims else "no shapes"),
        cc=cc, deterministic=torch.are_deterministic_algorithms_enabled(),
        tuned=choice.entry.get("backward") if choice is not None and forward is None else None).text()


def _sdpa_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float]) -> tuple:
    """(out, lse) of SDPA's flash forward (causal bottom-right; lse natural log [B, H, Sq]): the compiled op's
    forward where the tuned one does not serve the call (the backward then runs on SDPA's O and lse)."""
    group = q.shape[1] // k.shape[1]
    k, v = _backward.expand_kv(k, group), _backward.expand_kv(v, group)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    return torch.empty_like(q).copy_(out), lse.contiguous()


@torch.library.custom_op(f"{PACKAGE}::attention_train", mutates_args=())
def _train_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    kernel = forward_kernel(q, k, v, causal)
    if isinstance(kernel, str) or _backward.device_backward(q, causal, k).kind == _backward.SDPA:
        return _sdpa_forward(q, k, v, causal, scale)
    return _forward(kernel, q, k, v, scale)


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in the strides of empty_like(ref), what the fake implementations promise torch.compile."""
    return t if t.stride() == ref.stride() else torch.empty_like(ref).copy_(t)


@torch.library.register_fake(f"{PACKAGE}::attention_train")
def _train_op_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op(f"{PACKAGE}::attention_train_backward", mutates_args=())
def _train_backward_op(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool,
                       scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _backward_of(grad_out, q, k, v, out, lse, causal, scale)
    return _like(dq, q), _like(dk, k), _like(dv, v)


@torch.library.register_fake(f"{PACKAGE}::attention_train_backward")
def _train_backward_fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         out: torch.Tensor, lse: torch.Tensor, causal: bool,
                         scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal, ctx.scale = causal, scale


def _op_backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Any) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _train_backward_op(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


torch.library.register_autograd(f"{PACKAGE}::attention_train", _op_backward, setup_context=_setup_context)
