"""explain()'s lines on the chosen dispatch entry (the kernel, where it was tuned, why, a measured or routed cell).

Part of the runtime every export ships (this folder, copied whole).
"""

from typing import Any

from . import kernels as _kernels, masked as _masked
from .dispatch import NO_MASK, cell_summary


def choice_lines(choice: Any, mask: tuple, inputs: str = "", takes: str = "") -> list[str]:
    """explain()'s lines on the chosen entry: the kernel, where it was tuned, why, and a measured or routed cell
    (`inputs`: what a fallback runs on, `takes`: what the kernel takes, for an FP8 call)."""
    e = choice.entry
    ratio = e.get("ratio_to_best_baseline")
    vs_base = f", {ratio:.2f}x the best baseline ({e.get('best_baseline_impl')})" if ratio else ""
    lines = [f"  kernel: {e['kernel']}",
             f"  tuned on {e['problem_label']} (trial {e['trial_id']}): {e['median_us']:.1f} us{vs_base}",
             f"  why: {choice.reason}"]
    replayed = (e.get("run") or {}).get("replayed_from")
    if replayed:  # the manifest says so; so does explain(), the one place a user reads the timing
        lines.insert(2, f"  REPLAYED: that timing was answered from a recording ({replayed}) by `tuner search "
                        "--backend replay`, not measured on a GPU")
    lines += backward_lines(e)
    if takes and choice.route != "sdpa":
        lines.append(f"  {takes}")
    if choice.cell is not None:
        checked = _kernels.manifest()["checked"]
        lines.append(f"  checked on {checked.get('gpu_name', '?')} by `tuner export --check`: "
                     f"{cell_summary(choice.cell)}")
        if choice.route == "sdpa" and mask != NO_MASK:
            lines.append(f"  routed: calls of this cell run {_masked.fallback_name(mask)}{inputs}")
    elif e.get("route") == "sdpa":
        sdpa = e.get("ratio_to_sdpa", ratio)
        ran = ("SDPA" if mask == NO_MASK else _masked.fallback_name(mask)) + inputs
        lines.append(f"  routed to {ran}: the kernel measured {sdpa:.2f}x the best SDPA backend on its tuned "
                     "problem (cells below 0.98x run torch SDPA, so the export never makes a call slower)")
    return lines


def backward_lines(entry: Any) -> list[str]:
    """The entry's shipped backward (what a call whose inputs require grad runs after this forward, where it loads
    on the device), or why it has none (an export before backward kernels says nothing)."""
    tuned = entry.get("backward")
    if isinstance(tuned, dict):
        ratio = tuned.get("ratio_to_sdpa")
        speed = f", {ratio:.2f}x SDPA's best backward" if isinstance(ratio, (int, float)) else ""
        return [f"  backward kernel: {tuned.get('kernel')} (trial {tuned.get('trial_id')}, confirmed on "
                f"{tuned.get('problem_label')}{speed})"]
    if entry.get("backward_note"):
        return [f"  backward kernel: none shipped, SDPA's backward serves training calls ({entry['backward_note']})"]
    return []
