"""Packed sequences (Problem layout "packed") in a search: the kernel reads the batch packed, [total, H, D] with
cumulative lengths; the reference and the baselines read the same values as padded [B, H, S, D] tensors, sequence
b in the first key_lengths()[b] rows of batch row b (make_inputs draws those). A packed kernel's output is
scattered back into that padded form to be checked, the rows past each sequence's end left out of the error."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

from tuner.problem import Problem


def packed_inputs(problem: Problem, q: Any, k: Any, v: Any) -> dict[str, Any]:
    """The packed copies of the padded q, k, v (contiguous [total, H, D]), the int32 cumulative lengths on their
    device, the longest length and the lengths: what AttentionKernel.packed takes."""
    import torch

    lengths = problem.key_lengths()
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)

    def pack(t: Any) -> Any:
        return torch.cat([t[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)]).contiguous()

    return {"q": pack(q), "k": pack(k), "v": pack(v), "lengths": lengths, "max": max(lengths),
            "cu": torch.tensor(cu, dtype=torch.int32, device=q.device)}


def unpack_into(packed_out: Any, out: Any, lengths: Sequence[int]) -> None:
    """packed_out [total, H, D] into the padded out [B, H, S, D], sequence b into batch row b's first rows."""
    start = 0
    for b, n in enumerate(lengths):
        out[b, :, :n] = packed_out[start:start + n].transpose(0, 1)
        start += n


def packed_call(kernel: Any, data: dict[str, Any], out: Any, checked: bool) -> Any:
    """A packed kernel's launch on the problem's packed inputs (data["packed"]). Checked (the verify launch): the
    inputs validated, a NaN-poisoned packed output, scattered into the padded `out` afterwards. Else the launch
    alone (what is timed) into a packed output of its own."""
    p = data["packed"]
    packed_out = p["q"].new_full(p["q"].shape, float("nan"))

    def launch() -> None:
        kernel.packed(p["q"], p["k"], p["v"], packed_out, p["cu"], p["cu"], p["max"], p["max"], data["scale"],
                      check=checked)

    if not checked:
        return launch

    def verified() -> None:
        launch()
        unpack_into(packed_out, out, p["lengths"])

    return verified


def packed_reference(problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float]) -> Any:
    """fp32 [B, H, S, D]: each sequence attending to its own keys (causal and the window aligned to its end),
    zero past its end."""
    import torch

    from tuner.runtime.verify import problem_reference

    ref = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b, n in enumerate(problem.key_lengths()):
        ref[b:b + 1, :, :n] = problem_reference(problem, q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                                scale)[0]
    return ref


def valid_rows(problem: Problem, device: Any) -> Any:
    """bool [B, 1, S, 1]: the rows of the padded form that hold a sequence's queries."""
    import torch

    lengths = torch.tensor(problem.key_lengths(), device=device)
    return (torch.arange(problem.seq_q, device=device)[None, :] < lengths[:, None])[:, None, :, None]


def packed_baselines(problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float], fa4: bool = True) -> list[Any]:
    """What a packed batch runs without the tuned kernels: each SDPA backend that takes every sequence, called once
    per sequence on its slice of the padded tensors (a window as each sequence's boolean mask; no softcap), and
    FlashAttention-4's varlen forward on the packed copies (made here, outside the timed calls)."""
    from tuner.runtime.baselines import SDPA_BACKENDS, Baseline, sdpa_skipped

    found = []
    for name in SDPA_BACKENDS:
        if name not in sdpa_skipped(problem):
            baseline = _sdpa_loop(name, problem, q, k, v, scale)
            if baseline is not None:
                found.append(baseline)
    if fa4:
        run = _fa4_varlen(problem, packed_inputs(problem, q, k, v), scale)
        if run is not None:
            found.append(Baseline("fa4", run, None))
    return found


def _sdpa_loop(name: str, problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float]) -> Any:
    """SDPA restricted to one backend, one call per sequence; None where the backend rejects one."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    from tuner.runtime.baselines import SDPA_BACKENDS, Baseline
    from tuner.runtime.verify import keys_kept

    calls = []
    window = (problem.window_left, problem.window_right)
    for b, n in enumerate(problem.key_lengths()):
        kwargs: dict[str, Any] = {"scale": scale, "enable_gqa": problem.heads != problem.heads_kv}
        if problem.local:
            kwargs["attn_mask"] = keys_kept(n, n, n, problem.causal, q.device, window)
        else:
            kwargs["is_causal"] = problem.causal
        calls.append(((q[b:b + 1, :, :n], k[b:b + 1, :, :n], v[b:b + 1, :, :n]), kwargs))

    def run() -> Any:
        return [F.scaled_dot_product_attention(*tensors, **kwargs) for tensors, kwargs in calls]

    baseline = Baseline(name, run, getattr(SDPBackend, SDPA_BACKENDS[name]))
    with baseline.restrict(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            run()
        except RuntimeError:  # this backend does not take some sequence
            return None
    torch.cuda.synchronize()
    return baseline


def _fa4_varlen(problem: Problem, packed: dict[str, Any], scale: Optional[float]) -> Any:
    """FlashAttention-4's flash_attn_varlen_func on the packed batch (a callable), or None where it does not
    import or rejects the problem. Its first call compiles (made here)."""
    from tuner.runtime.baseline_log import warnings_logged
    from tuner.runtime.baselines import FA4, use_fa4_cache

    use_fa4_cache()
    with warnings_logged(FA4, "import"):
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except Exception:  # not installed, or its compiler library does not load here
            return None
    kwargs: dict[str, Any] = {"softmax_scale": scale, "causal": problem.causal}
    if problem.local:  # as fa4_baseline: an unbounded side is None
        kwargs["window_size"] = tuple(None if s < 0 else s for s in (problem.window_left, problem.window_right))
    if problem.softcap:
        kwargs["softcap"] = problem.softcap
    p = packed

    def run() -> Any:
        return flash_attn_varlen_func(p["q"], p["k"], p["v"], cu_seqlens_q=p["cu"], cu_seqlens_k=p["cu"],
                                      max_seqlen_q=p["max"], max_seqlen_k=p["max"], **kwargs)

    with warnings_logged(FA4, "compile and first call"):
        try:
            run()
            import torch

            torch.cuda.synchronize()
        except Exception:  # a shape or feature it does not take: not a baseline for this problem
            return None
    return run
