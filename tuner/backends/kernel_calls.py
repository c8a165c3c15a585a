"""A problem's launch in the GPU worker: the inputs a kernel takes besides q, k, v for the problem's K/V layout
(layout_inputs), and the kernel's checked or bare launch on them (kernel_call)."""

from __future__ import annotations

from typing import Any, Callable

from tuner.problem import Problem
from tuner.runtime.backward_trial import backward_call, grad_tolerance, poisoned_grads
from tuner.runtime.build import BuiltKernel
from tuner.runtime.packed import packed_call, packed_inputs
from tuner.runtime.verify import TOLERANCE, empty_output, paged_inputs, ragged_seq_lens


def layout_inputs(problem: Problem, q: Any, k: Any, v: Any, seed: int) -> dict[str, Any]:
    """What kernel_call takes besides q, k, v for the problem's K/V layout and lengths: a paged layout's shuffled
    pages, table and lengths (the reference and SDPA read k and v dense), a ragged batch's lengths (each row's
    keys, read by the kernel on the GPU), packed sequences' packed copies (the reference and SDPA read them
    padded)."""
    found = paged_inputs(problem, k, v, seed) if problem.page_size else {}
    if problem.packed:  # the kernel's packed copies; the lengths travel in them
        return {"packed": packed_inputs(problem, q, k, v)}
    if problem.ragged:
        found["seq_lens"] = ragged_seq_lens(problem, k.device)
    return found


def load_kernel(built: BuiltKernel, problem: Problem, device: int, cubin: Any = None) -> Any:
    """The loaded kernel of a variant: a forward's (BuiltKernel.load), or a backward's three (BackwardKernel)."""
    if problem.backward:
        from tuner.runtime.backward_launch import BackwardKernel

        return BackwardKernel(built, device)
    return built.load(device, cubin)


def trial_output(problem: Problem, data: dict[str, Any]) -> Any:
    """What a kernel writes, NaN-poisoned so unwritten elements show: the output (like q), or a backward's dq, dk,
    dv (like q, k, v). data["ref"].error() compares it with the reference."""
    return poisoned_grads(data) if problem.backward else empty_output(data["q"])


def tolerance(problem: Problem) -> float:
    """The error below which a kernel's output is correct: the dtype's, twice it for each gradient of a backward."""
    return grad_tolerance(problem) if problem.backward else TOLERANCE[problem.dtype]


def kernel_call(kernel: Any, data: dict[str, Any], out: Any, checked: bool) -> Callable[[], None]:
    """The kernel's launch on a problem's inputs (the paged form for a paged layout, the key lengths of a
    ragged batch, FP8 inputs' descales); `checked` validates the inputs first (the verify launch),
    else the launch alone (what is timed). A 16-bit problem's calls pass no descales at all. A backward problem's
    inputs (runtime.backward_trial.backward_inputs: its dO, O and lse) go to a backward kernel's three launches."""
    if "lse" in data:
        return backward_call(kernel, data, out, checked)
    if "packed" in data:
        return packed_call(kernel, data, out, checked)
    q, k, v, scale = data["q"], data["k"], data["v"], data["scale"]
    descales = data.get("descales")  # FP8 inputs' Descales (a (q, k, v) tuple of [B, Hkv] float32; q None: a cache)
    if "block_table" in data:
        kc, vc, table, lens = data["k_cache"], data["v_cache"], data["block_table"], data["seq_lens"]
        return lambda: kernel.paged(q, kc, vc, out, table, lens, scale, check=checked, descales=descales)
    lens = data.get("seq_lens")  # a ragged batch's lengths (None: every row uses all Sk keys)
    if descales is not None:
        if checked:
            return lambda: kernel(q, k, v, out, None, scale, seq_lens=lens, descales=descales)
        return lambda: kernel.launch_unchecked(q, k, v, out, None, scale, lens, descales)
    if checked:
        return lambda: kernel(q, k, v, out, None, scale, seq_lens=lens)
    return lambda: kernel.launch_unchecked(q, k, v, out, None, scale, lens)
