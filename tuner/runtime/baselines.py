"""torch SDPA backends, timed the same way as tuned kernels, in the same process."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from tuner.problem import Problem
from tuner.runtime.timing import Timing, time_cuda

# Name stored in the results database -> torch SDPBackend member name.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}


@dataclass(frozen=True)
class Baseline:
    name: str
    call: Callable[[], Any]  # runs SDPA; must be called inside `restrict()`
    backend: Any  # torch.nn.attention.SDPBackend member

    def restrict(self) -> Any:
        """Context manager limiting SDPA to this backend (entered once, outside the timed region)."""
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([self.backend])

    def time(self, **kwargs: Any) -> Timing:
        with self.restrict():
            return time_cuda(self.call, **kwargs)


def sdpa_baseline(name: str, q: Any, k: Any, v: Any, causal: bool, scale: float | None = None) -> Baseline:
    """SDPA restricted to one backend; RuntimeError (from torch) when it cannot take the problem."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    member = getattr(SDPBackend, SDPA_BACKENDS[name])
    sq, sk = q.shape[2], k.shape[2]
    kwargs: dict[str, Any] = {"scale": scale}
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if causal and sq == sk:
        kwargs["is_causal"] = True
    elif causal:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(sq, sk)

    def run() -> Any:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    baseline = Baseline(name, run, member)
    # torch explains a rejection with a UserWarning per backend and call before it raises: the
    # rejection is the answer here (the backend is not a baseline), not something to show the user.
    with baseline.restrict(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        run()  # fail early if the backend rejects the problem
    torch.cuda.synchronize()
    return baseline


def available_baselines(problem: Problem, q: Any, k: Any, v: Any, scale: float | None = None) -> list[Baseline]:
    """Every SDPA backend that runs this problem on this card."""
    found = []
    for name in SDPA_BACKENDS:
        try:
            found.append(sdpa_baseline(name, q, k, v, problem.causal, scale))
        except RuntimeError:
            continue
    return found
