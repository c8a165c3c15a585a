"""Which tuned backward an export ships beside each forward problem, and why or why not.

The confirmed backward winner of the same problem (same shape, dtype, causality, GQA and layout; pass backward)
ships where its confirm stage timed it faster than every SDPA backward it ran beside it (ratio > 1 to the best of
SDPA's cuDNN and flash backward, round by round); elsewhere the package's backward stays SDPA's, and the export
says why. FlashAttention-4's backward is not what a package falls back to, so it does not decide here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from tuner.errors import TunerError
from tuner.export.selection import ExportedKernel, best_per_round, build_kernel
from tuner.problem import BACKWARD, Problem
from tuner.runtime.timing import per_round_ratio
from tuner.store import TrialRow

SDPA_BACKWARDS = ("sdpa_cudnn", "sdpa_flash")  # the baselines a package's backward falls back to


@dataclass(frozen=True)
class BackwardPick:
    """The backward an export ships for one forward problem: `row` (the confirmed backward winner) and its
    confirmed ratio to SDPA's best backward, or none (row None) and `reason` saying why."""

    problem: Problem  # the forward problem
    row: Optional[TrialRow]
    ratio: Optional[float]
    reason: str
    median_us: Optional[float] = None  # the confirm stage's figure of the winner


def backward_problem(problem: Problem) -> Problem:
    """The backward problem of a forward one: the same call, pass backward."""
    return dataclasses.replace(problem, kernel_pass=BACKWARD)


def pick_backward(store: Any, profile: str, problem: Problem) -> BackwardPick:
    """The confirmed backward winner of `problem` on GPU profile `profile`, if it beat SDPA's backward."""
    confirmed = store.confirmed(backward_problem(problem), profile, objective="time")
    if confirmed is None:
        return BackwardPick(problem, None, None, "no confirmed backward winner in the store (`tuner search --pass "
                                                 "backward` tunes and confirms one)")
    timings = store.confirm_timings(confirmed.confirmation_id)
    mine = timings.get(confirmed.variant_name)
    sdpa = [timings[n] for n in SDPA_BACKWARDS if n in timings]
    if not mine or not sdpa:
        return BackwardPick(problem, None, None, f"the confirm stage of its backward winner {confirmed.variant_name} "
                                                 "timed no SDPA backward beside it")
    ratio = per_round_ratio(best_per_round(sdpa), mine)
    if not ratio > 1.0:
        return BackwardPick(problem, None, ratio, f"its confirmed backward winner {confirmed.variant_name} measured "
                                                  f"{ratio:.2f}x SDPA's best backward, not faster")
    return BackwardPick(problem, store.trial_detail(confirmed.trial_id), ratio,
                        f"{confirmed.variant_name}: {ratio:.2f}x SDPA's best backward (confirmed)", confirmed.median_us)


def build_backward(pick: BackwardPick, arch: str, allow_rebuild: bool) -> ExportedKernel:
    """The picked backward winner built for `arch` (the cubin checked as a forward's), with its launch facts."""
    from tuner.runtime.backward_launch import shape_dict

    row = pick.row
    assert row is not None, "build_backward takes a pick that ships a kernel"
    try:
        kernel = build_kernel(row, arch, allow_rebuild)
        return dataclasses.replace(kernel, backward=shape_dict(kernel.variant))
    except TunerError as exc:
        raise TunerError(f"the backward winner of {pick.problem.label} (trial {row.id}): {exc}") from None


def backward_fields(pick: BackwardPick, kernel: Optional[ExportedKernel]) -> dict[str, Any]:
    """A manifest entry's record of its backward: the kernel, its trial, confirmed µs and ratio to SDPA's best
    backward; or null, and why."""
    if pick.row is None or kernel is None:
        return {"backward": None, "backward_note": pick.reason}
    return {"backward": {"kernel": kernel.variant.name, "trial_id": pick.row.id, "problem_label": pick.row.problem.label,
                         "median_us": pick.median_us, "ratio_to_sdpa": pick.ratio, "rebuilt": kernel.rebuilt},
            "backward_note": pick.reason}


def attach_backwards(entries: list[dict[str, Any]], picks: list[BackwardPick], arch: str, allow_rebuild: bool,
                     built: dict[str, ExportedKernel]) -> None:
    """Each entry's backward record (entries and picks in one order), the shipped backward kernels added to
    `built` (one per variant). Every pick is built before any entry changes: a failure changes nothing."""
    kernels = [build_backward(p, arch, allow_rebuild) if p.row is not None else None for p in picks]
    for entry, pick, kernel in zip(entries, picks, kernels):
        entry.update(backward_fields(pick, kernel))
        if kernel is not None:
            built.setdefault(kernel.variant.name, kernel)
