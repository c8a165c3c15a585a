"""tuner export --check of a packed cell (attention_varlen's): what a routed packed cell runs, timed as the package
runs it.

A routed packed call runs the package's own per-sequence fallback (varlen.packed_fallback: one host read of the
cumulative lengths, then SDPA, or the masked fallback for a window or softcap, once per sequence), so that is the
rival timed; FlashAttention-4's varlen call is not what a routed cell would run, so it is not timed here."""

from __future__ import annotations

import importlib
from typing import Any

from tuner.problem import Problem


def fallback_baseline(pkg: Any, problem: Problem, data: dict[str, Any]) -> Any:
    """The package's per-sequence fallback of the cell's packed inputs (data["packed"]: gpu_child.layout_inputs'),
    as a Baseline named after what it runs."""
    from tuner.runtime.baselines import Baseline

    varlen = importlib.import_module(f"{pkg.__name__}._runtime.varlen")
    masked = importlib.import_module(f"{pkg.__name__}._runtime.masked")
    causal, mask = masked.causal_form(problem.causal, masked.call_mask(
        (problem.window_left, problem.window_right), problem.softcap, problem.causal))
    p = data["packed"]
    name = "sdpa_per_sequence" if mask == masked.NO_MASK else "masked_per_sequence"
    return Baseline(name, lambda: varlen.packed_fallback(p["q"], p["k"], p["v"], p["cu"], p["cu"], p["max"], p["max"],
                                                         causal, data["scale"], mask), None)
