"""The baselines a tuned kernel is timed against in the same process, the same way: every torch SDPA
backend that takes the problem, and FlashAttention-4 (`flash_attn.cute`, an optional extra) where it
imports and takes the problem. A sliding window reaches SDPA as a boolean mask (its flash backend takes
none); a softcap cannot reach SDPA at all (sdpa_skipped says so). An e4m3 problem's SDPA and FA4 baselines
run in bf16 on its dequantised inputs (the same real values): neither has an FP8 path on sm90 (FA4's sm90
forward takes fp16/bf16 only), and "our FP8 kernel vs the best bf16 attention" is the question an FP8
kernel answers; native FP8 baselines plug in at fp8_baselines."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Optional

from tuner.dtypes import spec
from tuner.kernels.compiler import cache_root
from tuner.problem import Problem
from tuner.runtime.baseline_log import warnings_logged
from tuner.runtime.cudnn_fp8 import cudnn_fp8_baseline
from tuner.errors import TunerError
from tuner.runtime.fp8 import Descales, dequantized_inputs
from tuner.runtime.packed import packed_inputs
from tuner.runtime.timing import Pruner, Timing, confirm_pruner, time_call
from tuner.runtime.verify import keys_kept

# Name stored in the results database -> torch SDPBackend member name.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}
FA4 = "fa4"  # FlashAttention-4's forward (flash_attn.cute.flash_attn_func)
# FlashAttention-4's persistent compile cache (flash_attn/cute/cache_utils.py reads both when imported). It
# is off by default: every process compiled each of its kernels again, seconds per problem and run.
FA4_CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def sdpa_skipped(problem: Problem) -> dict[str, str]:
    """The SDPA backends not tried on `problem`, each with why: what SDPA's interface cannot express. A backward
    problem is timed against SDPA's flash and cuDNN backward ops on the forward's O and lse (runtime.backward_trial),
    which take no window or softcap."""
    if problem.backward:
        if problem.local or problem.softcap:
            return dict.fromkeys(SDPA_BACKENDS, "SDPA's backward ops take no sliding window or softcap")
        return {"sdpa_efficient": "a backward is timed against SDPA's flash and cuDNN backward"}
    if problem.softcap:
        return dict.fromkeys(SDPA_BACKENDS, "SDPA has no logit softcapping")
    if problem.local:
        return {"sdpa_flash": "SDPA's flash backend takes no attn_mask, and a sliding window needs one"}
    return {}


def missing_baselines_note(problem: Problem) -> Optional[str]:
    """One line naming the SDPA baselines `problem` cannot have, and why, and for e4m3 that the baselines
    run in bf16 (None: every backend is tried on the problem's own dtype)."""
    notes = []
    skipped = sdpa_skipped(problem)
    if skipped:
        names = "SDPA" if set(skipped) == set(SDPA_BACKENDS) else ", ".join(skipped)
        notes.append(f"no {names} baseline: {'; '.join(dict.fromkeys(skipped.values()))}")
    if problem.dtype == "e4m3":
        notes.append("no FP8 SDPA or FA4: they run in bf16 on the dequantised inputs")
    elif problem.fp8_kv:
        notes.append("no FP8 KV cache in SDPA or FA4: they run on k and v dequantised to q's dtype")
    return "; ".join(notes) or None


def sdpa_mask(problem: Problem, device: Any) -> Any:
    """SDPA's attn_mask for `problem` (bool, True = kept, causality included): [B, 1, Sq, Sk] for a ragged
    batch (each row's keys), [1, 1, Sq, Sk] for a sliding window; None where the causal flag says it all."""
    if not (problem.ragged or problem.local):
        return None
    import torch

    window = (problem.window_left, problem.window_right)
    lengths = problem.key_lengths() if problem.ragged else (problem.seq_k,)
    return torch.stack([keys_kept(problem.seq_q, problem.seq_k, n, problem.causal, device, window)
                        for n in lengths])[:, None]


def confirm_stage_pruner(variants: Collection[str], timed: Iterable[str]) -> Pruner:
    """The confirm stage's early stops (runtime.timing.confirm_pruner) over the implementations `timed`:
    each one that is not a variant is a baseline, and the fastest SDPA backend always runs every round
    (an export routes a cell by it)."""
    return confirm_pruner(variants, [name for name in timed if name not in variants], keep_fastest_of=SDPA_BACKENDS)


@dataclass(frozen=True)
class Baseline:
    name: str
    call: Callable[[], Any]  # runs the baseline; must be called inside `restrict()`
    backend: Any  # torch.nn.attention.SDPBackend member; None for a baseline that is not SDPA

    def restrict(self) -> Any:
        """Context manager limiting SDPA to this backend (entered once, outside the timed region)."""
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([self.backend])

    def time(self, **kwargs: Any) -> Timing:
        """runtime.timing.time_call of the baseline (its kwargs: meter, isolated_too, time_cuda's)."""
        with self.restrict(), warnings_logged(self.name, "timing"):
            return time_call(self.call, **kwargs)


def sdpa_baseline(name: str, q: Any, k: Any, v: Any, causal: bool, scale: float | None = None,
                  mask: Any = None) -> Baseline:
    """SDPA restricted to one backend; RuntimeError (from torch) when it cannot take the problem. `mask`
    (bool, True = kept; causality included) replaces the causal flag: a ragged batch's keys, a window."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    member = getattr(SDPBackend, SDPA_BACKENDS[name])
    sq, sk = q.shape[2], k.shape[2]
    kwargs: dict[str, Any] = {"scale": scale}
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if mask is not None:
        kwargs["attn_mask"] = mask
    elif causal and sq == sk:
        kwargs["is_causal"] = True
    elif causal:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(sq, sk)

    def run() -> Any:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    baseline = Baseline(name, run, member)
    # torch explains a rejection with a UserWarning per backend and call before it raises: the
    # rejection is the answer here (the backend is not a baseline), not something to show the user.
    with baseline.restrict(), warnings_logged(name, "first call"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        run()  # fail early if the backend rejects the problem
    torch.cuda.synchronize()
    return baseline


def use_fa4_cache() -> dict[str, str]:
    """Turn on FlashAttention-4's persistent compile cache, in the tuner's cache folder (<cache>/fa4),
    for an import of flash_attn.cute to come; a setting of the user's (either variable) stands. Returns
    what was set."""
    wanted = {FA4_CACHE_ENABLED_ENV: "1", FA4_CACHE_DIR_ENV: str(cache_root() / "fa4")}
    chosen = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(chosen)
    return chosen


def import_baselines() -> None:
    """Import the baselines' libraries ahead of their first use (FlashAttention-4's, with its compile cache on:
    seconds of its compiler's start-up); where one does not import, its baseline is simply missing later."""
    fa4_function("flash_attn_func")


def fa4_baseline(q: Any, k: Any, v: Any, causal: bool, scale: float | None = None,
                 window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> Optional[Baseline]:
    """FlashAttention-4 on this problem, or None where it does not import or rejects the problem.

    It takes [B, S, H, D] tensors: contiguous copies are made here, outside the timed call (the layout
    change is not the kernel's work). Causal masking and the window (Problem.window_left/right, -1
    unbounded) are bottom-right aligned, as the tuned kernels'; `softcap` 0 is off. Its first call for a
    shape compiles (seconds; a load from its cache after the first run): made here, before any timing.
    Its compiler's warnings go to the baselines' log.
    """
    flash_attn_func = fa4_function("flash_attn_func")
    if flash_attn_func is None:
        return None
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    kwargs = fa4_kwargs(scale, causal, window, softcap)
    return fa4_if_it_runs(lambda: flash_attn_func(qb, kb, vb, **kwargs), qb.is_cuda)


def fa4_function(name: str) -> Any:
    """flash_attn.cute's `name` (its compile cache on), or None where it does not import."""
    use_fa4_cache()
    with warnings_logged(FA4, "import"):
        try:
            import flash_attn.cute as cute
        except Exception:  # not installed, or its compiler library does not load here
            return None
    return getattr(cute, name, None)


def fa4_kwargs(scale: float | None, causal: bool, window: tuple[int, int], softcap: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"softmax_scale": scale, "causal": causal}
    if window != (-1, -1):
        # FA4 reads a -1 side as a bound of -1 (only (-1, -1) together means none): an unbounded side is
        # None. Causal with a left bound it runs as the window (left, 0), which is what the problem means.
        kwargs["window_size"] = tuple(None if side < 0 else side for side in window)
    if softcap:
        kwargs["softcap"] = softcap
    return kwargs


def fa4_if_it_runs(run: Callable[[], Any], cuda: bool) -> Optional[Baseline]:
    """FA4's `run` as a baseline, after its first call (which compiles); None where that call fails."""
    with warnings_logged(FA4, "compile and first call"):
        try:
            run()
            if cuda:
                import torch

                torch.cuda.synchronize()
        except Exception:  # a shape, dtype, head dim or feature it does not take: not a baseline for this problem
            return None
    return Baseline(FA4, run, None)


def fp8_baselines(problem: Problem, q: Any, k: Any, v: Any, scale: float | None, descales: Descales) -> list[Baseline]:
    """Baselines that run an e4m3 problem in FP8 itself, on its fp8 q, k, v and descales (available_baselines
    adds them after the bf16 ones): cuDNN's FP8 forward where its frontend imports and takes the problem
    (tuner.runtime.cudnn_fp8; per-tensor descales, the [0, 0] elements: the same work, a timing baseline)."""
    if problem.ragged or problem.local or problem.softcap:
        return []  # its graph is a plain dense call: no key lengths, window or softcap
    found = cudnn_fp8_baseline(q, k, v, descales, problem.causal, scale)
    return [] if isinstance(found, str) else [Baseline(found[0], found[1], None)]


def available_baselines(problem: Problem, q: Any, k: Any, v: Any, scale: float | None = None,
                        fa4: bool = True, descales: Optional[Descales] = None) -> list[Baseline]:
    """Every SDPA backend that runs this problem on this card, and FlashAttention-4 where it runs it
    (`fa4=False`: SDPA only, e.g. where the question is whether to fall back to SDPA). A ragged batch or
    a sliding window goes to SDPA as a mask of the keys each query sees (what a model passes it); FA4's
    dense call cannot take a ragged batch. SDPA backends in sdpa_skipped are not tried. A problem with FP8
    inputs needs their `descales`: SDPA and FA4 get the dequantised values (e4m3: in bf16, then come
    fp8_baselines; an FP8 KV cache: k and v in q's dtype), copies made here, outside the timed calls."""
    if problem.packed:  # one SDPA call per sequence, FA4's varlen call
        return packed_baselines(problem, q, k, v, scale, fa4)
    native: list[Baseline] = []
    if problem.fp8:
        if descales is None:
            raise TunerError(f"the baselines of a problem in {problem.dtype} need the scales of its FP8 inputs "
                             f"(fp8_inputs)")
        import torch

        if problem.dtype == "e4m3":
            native = fp8_baselines(problem, q, k, v, scale, descales)
        # in the registry's baseline type: e4m3's bf16; an FP8 KV cache's q's dtype (the unquantised model's attention)
        q, k, v = dequantized_inputs(q, k, v, descales, getattr(torch, spec(problem.dtype).baseline.torch))
    skipped = sdpa_skipped(problem)
    mask = sdpa_mask(problem, q.device) if len(skipped) < len(SDPA_BACKENDS) else None
    found = []
    for name in SDPA_BACKENDS:
        if name in skipped:
            continue
        try:
            found.append(sdpa_baseline(name, q, k, v, problem.causal, scale, mask))
        except RuntimeError:
            continue
    window = (problem.window_left, problem.window_right)
    extra = fa4_baseline(q, k, v, problem.causal, scale, window, problem.softcap) \
        if fa4 and not problem.ragged else None
    return found + ([extra] if extra is not None else []) + native


def packed_baselines(problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float], fa4: bool = True) -> list[Any]:
    """What a packed batch runs without the tuned kernels: each SDPA backend that takes every sequence, called once
    per sequence on its slice of the padded tensors (a window as each sequence's boolean mask; no softcap), and
    FlashAttention-4's varlen forward on the packed copies (made here, outside the timed calls)."""
    found = []
    skipped = sdpa_skipped(problem)
    for name in SDPA_BACKENDS:
        if name not in skipped:
            baseline = _sdpa_per_sequence(name, problem, q, k, v, scale)
            if baseline is not None:
                found.append(baseline)
    varlen = fa4_function("flash_attn_varlen_func") if fa4 else None
    if varlen is not None:
        p = packed_inputs(problem, q, k, v)
        kwargs = fa4_kwargs(scale, problem.causal, (problem.window_left, problem.window_right), problem.softcap)
        extra = fa4_if_it_runs(lambda: varlen(p["q"], p["k"], p["v"], cu_seqlens_q=p["cu"], cu_seqlens_k=p["cu"],
                                               max_seqlen_q=p["max"], max_seqlen_k=p["max"], **kwargs),
                                p["q"].is_cuda)
        found += [extra] if extra is not None else []
    return found


def _sdpa_per_sequence(name: str, problem: Problem, q: Any, k: Any, v: Any, scale: Optional[float]) -> Any:
    """SDPA restricted to one backend, one call per sequence; None where the backend rejects one."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

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
    if q.is_cuda:
        torch.cuda.synchronize()
    return baseline
