"""The backward of a differentiable call: which backward kernel runs on the tuned forward's O and lse, and why.

Part of the runtime every export ships (this folder, copied whole). The tuned forward kernels write O and lse
(float32 [B, H, Sq] contiguous, the natural log of sum_j exp(scale * s_ij), -inf for a row that sees no key);
the backward runs on them without recomputing the forward. The backward kernels today are SDPA's, called
directly: FlashAttention-2's (aten._scaled_dot_product_flash_attention_backward: lse [B, H, Sq] natural log,
+inf for a row without keys; causal is bottom-right) and cuDNN's (aten._scaled_dot_product_cudnn_attention_backward,
faster on Hopper: its stats in the layout torch's own cuDNN forward writes them, found once per process by
running that forward on a tiny input; its causal mask is top-left, so it serves causal calls only where Sq == Sk).
Both want one K/V head per query head: k and v are expanded over the GQA group and dK, dV summed back.
A tuned backward kernel (an export's confirmed backward winner, faster than SDPA's where it was confirmed; see
tuned_backward.py) runs instead where the package ships one for the call's dispatch entry and it loads here.
choose_backward() is the one place that decides.
"""

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from .dispatch import NO_MASK

CUDNN, FLASH, SDPA, TUNED = "cudnn", "flash", "sdpa", "tuned"
NAMES = {CUDNN: "SDPA cuDNN backward on the tuned forward's O and lse",
         FLASH: "SDPA flash backward (FlashAttention-2) on the tuned forward's O and lse",
         TUNED: "tuned backward kernel {kernel} on the tuned forward's O and lse"}
CUDNN_MAX_HEAD_DIM = 128  # the head dims cuDNN's SDPA backward is used for here (64 and 128 are tested on an H200)
FLASH_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class BackwardChoice:
    """Which backward serves a differentiable call (CUDNN, FLASH, or SDPA: SDPA runs the whole call) and why."""

    kind: str
    reason: str
    kernel: Optional[str] = None  # TUNED: the backward kernel (the package's kernels table names it)

    def text(self) -> str:
        if self.kind == SDPA:
            return f"backward: SDPA (the whole call, forward and backward), because {self.reason}"
        return f"backward: {NAMES[self.kind].format(kernel=self.kernel)} (no forward recomputation): {self.reason}"


def choose_backward(*, head_dim: int, causal: bool, seq_q: int, seq_k: int, mask: tuple = NO_MASK,
                    form: str = "dense", forward: Optional[str] = None, cc: Optional[tuple[int, int]] = None,
                    cudnn: Optional[str] = None, deterministic: bool = False,
                    tuned: Optional[Mapping[str, Any]] = None, tuned_error: Optional[str] = None) -> BackwardChoice:
    """The backward of a call whose inputs require grad. `form`: "dense", or the call form no differentiable
    path takes ("seq_lens", "paged", "fp8", "fp8_cache"); `forward`: why the tuned forward does not serve the call
    (None: it does); `cc`: the device's compute capability (None: unknown, no device here); `cudnn`: why cuDNN's
    SDPA cannot run on this device and dtype (None: it runs, or unknown); `deterministic`: torch's deterministic
    algorithms are on (cuDNN's SDPA backward has no deterministic mode); `tuned`: the backward record of the call's
    dispatch entry (its kernel, tuned problem and confirmed ratio to SDPA's backward; None: the package ships none
    for it); `tuned_error`: why that kernel does not load on this device (None: it loads, or no device here)."""
    if form != "dense":
        return BackwardChoice(SDPA, {"seq_lens": "calls with seq_lens", "paged": "paged calls",
                                     "fp8": "FP8 (e4m3) calls", "fp8_cache": "FP8 KV-cache calls"}[form]
                              + " have no differentiable tuned path")
    if mask[:2] != NO_MASK[:2] or mask[2]:
        return BackwardChoice(SDPA, "sliding windows and softcaps have no differentiable tuned path")
    if forward is not None:
        return BackwardChoice(SDPA, forward)
    not_tuned = None if tuned is None else _why_not_tuned(tuned, tuned_error, deterministic)
    if tuned is not None and not_tuned is None:
        return BackwardChoice(TUNED, tuned_reason(tuned, cc), str(tuned["kernel"]))
    sdpa = _sdpa_backward(head_dim, causal, seq_q, seq_k, cc, cudnn, deterministic)
    if not_tuned is None:
        return sdpa
    return BackwardChoice(sdpa.kind, f"{sdpa.reason}; not the tuned backward {tuned['kernel']}: {not_tuned}")


def tuned_reason(tuned: Mapping[str, Any], cc: Optional[tuple[int, int]]) -> str:
    """Why the tuned backward runs: its tuned problem and confirmed speed-up over SDPA's best backward."""
    ratio = tuned.get("ratio_to_sdpa")
    speed = f"{ratio:.2f}x SDPA's best backward" if isinstance(ratio, (int, float)) else "faster than SDPA's backward"
    where = "" if cc is not None else "; no CUDA device here: it runs where it loads"
    return (f"the package ships it for this call's dispatch entry, confirmed at {speed} on "
            f"{tuned.get('problem_label', '?')} (trial {tuned.get('trial_id', '?')}){where}")


def _why_not_tuned(tuned: Mapping[str, Any], tuned_error: Optional[str], deterministic: bool) -> Optional[str]:
    if deterministic:
        return "torch's deterministic algorithms are on, and it accumulates dQ with fp32 atomics"
    return tuned_error


def _sdpa_backward(head_dim: int, causal: bool, seq_q: int, seq_k: int, cc: Optional[tuple[int, int]],
                   cudnn: Optional[str], deterministic: bool) -> BackwardChoice:
    """SDPA's backward of a dense call the tuned forward serves: cuDNN's where it runs, else flash's."""
    if cc is not None and cc < (8, 0):
        return BackwardChoice(SDPA, f"SDPA's flash backward needs compute capability 8.0+ (this device: "
                                    f"{cc[0]}.{cc[1]})")
    if head_dim % 8 or head_dim > FLASH_MAX_HEAD_DIM:
        return BackwardChoice(SDPA, f"head dim {head_dim}: SDPA's flash backward takes multiples of 8 up to "
                                    f"{FLASH_MAX_HEAD_DIM}")
    why_not = _why_not_cudnn(head_dim, causal, seq_q, seq_k, cc, cudnn, deterministic)
    if why_not is None:
        return BackwardChoice(CUDNN, "sm_90+, where cuDNN's is the faster SDPA backward")
    return BackwardChoice(FLASH, ("not cuDNN's: " + why_not) if cc is not None else
                          f"no CUDA device here: on sm_90+ cuDNN's runs instead where it can ({why_not})")


def _why_not_cudnn(head_dim: int, causal: bool, seq_q: int, seq_k: int, cc: Optional[tuple[int, int]],
                   cudnn: Optional[str], deterministic: bool) -> Optional[str]:
    if cc is None or cc < (9, 0):
        return "it is used on sm_90+ only" if cc is not None else "the device decides"
    if causal and seq_q != seq_k:
        return "its causal mask is top-left, the kernels' bottom-right (Sq != Sk)"
    if head_dim > CUDNN_MAX_HEAD_DIM:
        return f"head dim {head_dim} > {CUDNN_MAX_HEAD_DIM}"
    if deterministic:
        return "torch's deterministic algorithms are on, and it has no deterministic mode"
    return cudnn


# --- the conversions, pure functions (tested on the CPU in float64) ----------------------------------------


def expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, S, D] -> [B, Hkv * group, S, D]: query head h reads K/V head h // group."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def group_sum(grad: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv * group, S, D] -> [B, Hkv, S, D]: the gradient of expand_kv (each K/V head's group summed)."""
    return grad if group == 1 else grad.unflatten(1, (grad.shape[1] // group, group)).sum(2)


def flash_lse(lse: torch.Tensor, rows_without_keys: bool) -> torch.Tensor:
    """Our lse as FlashAttention-2's backward reads it: natural log, [B, H, Sq] contiguous (as ours), +inf where
    ours is -inf (a row that sees no key: exp(s - lse) is then 0, where -inf would give inf). Only calls that can
    have such rows (causal, Sq > Sk) pay the pass."""
    return torch.where(lse == float("-inf"), float("inf"), lse) if rows_without_keys else lse


def stats_layout(lse: torch.Tensor, rank: int, order: tuple[int, ...]) -> torch.Tensor:
    """Our lse [B, H, Sq] in the layout cuDNN's forward writes its stats (`rank` 3 or 4: [B, H, Sq, 1]; `order`:
    the dims of [B, H, Sq] from the largest stride to the smallest), the values unchanged (both natural log)."""
    if tuple(order) != (0, 1, 2):
        inverse = tuple(order.index(i) for i in range(3))
        lse = lse.permute(*order).contiguous().permute(*inverse)
    return lse.unsqueeze(-1) if rank == 4 else lse


def stride_order(t: torch.Tensor) -> tuple[int, ...]:
    """The first three dims of `t` from the largest stride to the smallest (ties: the earlier dim first)."""
    return tuple(sorted(range(3), key=lambda i: (-t.stride(i), i)))


# --- running them --------------------------------------------------------------------------------------------

_cudnn_forms: dict[tuple, Any] = {}  # (device, dtype, D, q's stride order) -> (rank, order) of cuDNN's stats, or why not


def cudnn_stats_form(q: torch.Tensor) -> Any:
    """(rank, stride order) of the stats torch's cuDNN SDPA forward writes for q's dtype, head dim and layout, or a
    string saying why it does not run here. Found once per process and form by running that forward on a tiny input
    (the backward's graph cache keys on q, k, v alone, so our stats must have the layout torch's own would); never
    during a CUDA graph capture (a warm-up step finds it): there, unknown forms read as not running."""
    key = (q.get_device(), q.dtype, q.shape[-1], stride_order(q))
    if key in _cudnn_forms:
        return _cudnn_forms[key]
    if torch.cuda.is_current_stream_capturing():
        return "its stats layout is found on a step before the capture (warm up eagerly first)"
    shape = (2, 3, 64, q.shape[-1])  # distinct sizes: the strides tell the layout
    order = key[3] + (3,)
    try:
        tiny = [torch.zeros([shape[i] for i in order], dtype=q.dtype, device=q.device).permute(
            *[order.index(i) for i in range(4)]) for _ in range(3)]
        stats = torch.ops.aten._scaled_dot_product_cudnn_attention(*tiny, None, True, 0.0, False, False)[1]
        form: Any = (stats.dim(), stride_order(stats))
    except (RuntimeError, NotImplementedError) as exc:
        form = f"cuDNN's SDPA does not run here ({str(exc).splitlines()[0][:160]})"
    _cudnn_forms[key] = form
    return form


def run_backward(kind: str, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: Optional[float]) -> tuple:
    """dq, dk, dv of the call by the `kind` of backward (CUDNN or FLASH), on the forward's out and lse."""
    group = q.shape[1] // k.shape[1]
    sq, sk = q.shape[2], k.shape[2]
    ke, ve = expand_kv(k, group), expand_kv(v, group)
    if grad_out.stride() != out.stride():  # the layout torch's own backward gets: dO like O
        grad_out = torch.empty_like(out).copy_(grad_out)
    none = torch.empty((), dtype=torch.int64, device=q.device)  # philox seed and offset: no dropout reads them
    if kind == CUDNN:
        rank, order = cudnn_stats_form(q)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, ke, ve, out, stats_layout(lse, rank, order), none, none, None, None, None, sq, sk, 0.0,
            causal, scale=scale)[:3]
    else:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, ke, ve, out, flash_lse(lse, causal and sq > sk), None, None, sq, sk, 0.0, causal, none,
            none, scale=scale)[:3]
    return dq, group_sum(dk, group), group_sum(dv, group)


def device_backward(q: torch.Tensor, causal: bool, k: torch.Tensor) -> BackwardChoice:
    """choose_backward for a dense call the tuned forward serves, on q's device (its capability, whether the
    package's tuned backward for the call loads there, cuDNN's form)."""
    from . import tuned_backward as _tuned  # loaded with the package's kernels: not needed by the pure choice

    cc = torch.cuda.get_device_capability(q.get_device())
    tuned, tuned_error = _tuned.record_for(q, k, causal), None
    if tuned is not None and not torch.are_deterministic_algorithms_enabled():
        try:
            _tuned.load_backward(str(tuned["kernel"]), q.get_device())
        except RuntimeError as exc:  # GpuUnavailableError: this card, a failed load (remembered)
            tuned_error = f"it does not load here ({exc})"
    choice = choose_backward(head_dim=q.shape[-1], causal=causal, seq_q=q.shape[2], seq_k=k.shape[2], cc=cc,
                             deterministic=torch.are_deterministic_algorithms_enabled(), tuned=tuned,
                             tuned_error=tuned_error)
    if choice.kind == CUDNN:
        form = cudnn_stats_form(q)
        if isinstance(form, str):
            return BackwardChoice(FLASH, "not cuDNN's: " + form)
    return choice
