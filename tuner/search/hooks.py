"""What a search calls out to: the measuring backend, the kernel builder and the clock.

Backends: `gpu` is tuner.backends.gpu.GpuBackend(device=..., profile=...);
`replay` is tuner.backends.replay.ReplayBackend. A backend whose `needs_compile` is
False is given built=None and no compiler is ever called.

`Hooks` bundles the three; a caller replaces them for one search by passing
its own (`run_search(options, hooks=Hooks(make_backend=...))`), as tests do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from tuner.backends.base import Backend
from tuner.backends.gpu import GpuBackend
from tuner.backends.replay import ReplayBackend
from tuner.errors import NoGpuError, TunerError
from tuner.kernels.variant import Variant
from tuner.profiles import GpuProfile, visible_gpu_count
from tuner.runtime.build import BuiltKernel, build

BACKENDS = ("gpu", "replay")


def check_backend(kind: str) -> None:
    """TunerError unless `kind` names a backend."""
    if kind not in BACKENDS:
        raise TunerError(f"unknown backend {kind!r}; expected one of {', '.join(BACKENDS)}")


def check_replay_source(kind: str, replay_from: Optional[str]) -> None:
    """TunerError when the replay backend is given no recording to replay."""
    if kind == "replay" and not replay_from:
        raise TunerError("--backend replay needs --from DB_URL (a results store recorded on a GPU)")


def make_backend(kind: str, device: int, profile: GpuProfile, *, replay_from: Optional[str] = None,
                 force: bool = False, seed: Optional[int] = None, objective: str = "time") -> Backend:
    """The backend `kind` ("gpu" or "replay") measuring on `device`; `seed` makes a GPU worker's random inputs,
    or a replay's draws among repeated recorded timings, reproducible; `objective` (tuner.runtime.objective) is what the
    search minimizes: the backend measures its figure, or refuses it in one line where it cannot."""
    check_backend(kind)
    check_replay_source(kind, replay_from)
    if kind == "replay":
        return ReplayBackend(replay_from, profile, force=force, seed=seed, objective=objective)
    return GpuBackend(device=device, profile=profile, objective=objective, seed=seed)  # seed: the inputs' draws


def require_gpus(devices: tuple[int, ...]) -> None:
    """NoGpuError unless a CUDA GPU is visible for every requested device (asked of the driver, not torch)."""
    count = visible_gpu_count()
    if count == 0:
        raise NoGpuError(
            "no usable CUDA GPU on this machine (the CUDA driver reports none); "
            "use --backend replay --from DB_URL to replay a recorded search"
        )
    missing = [d for d in devices if d < 0 or d >= count]
    if missing:
        raise TunerError(f"CUDA device {missing[0]} does not exist; this machine has {count}")


@dataclass(frozen=True)
class Hooks:
    """The backend factory, the kernel builder (render + compile; runs in the compile pool) and the
    wall clock (of deadlines) a worker uses."""

    make_backend: Callable[..., Backend] = make_backend
    build: Callable[[Variant, str], BuiltKernel] = build
    now: Callable[[], float] = time.time

    @property
    def replaced(self) -> bool:
        """True when any hook is not the default (such hooks cannot cross into child processes)."""
        return self != Hooks()
