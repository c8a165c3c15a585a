"""Packed sequences (Problem layout "packed") in a search: the kernel reads the batch packed, [total, H, D] with
cumulative lengths; the reference and the baselines read the same values as padded [B, H, S, D] tensors, sequence
b in the first key_lengths()[b] rows of batch row b (make_inputs draws those). A packed kernel's output is
scattered back into that padded form to be checked (verify.packed_expected), the rows past each sequence's end
left out of the error."""

from __future__ import annotations

from typing import Any, Sequence

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
