"""How a trial is measured: the interface between the search loop and its backends.

The search (tuner.search.run) asks a Backend to measure compiled variants and
baselines; the GPU backend (tuner.backends.gpu) runs them in a worker process
on a real card, the replay backend (tuner.backends.replay) answers from a recorded run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Mapping, Optional, Protocol, Sequence

from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.build import BuiltKernel
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timed, Timing
from tuner.status import TrialStatus


@dataclass(frozen=True)
class Measurement(Timed):
    """Outcome of verifying then timing one variant on one problem."""

    status: TrialStatus  # ok, incorrect, launch_error or timeout (compile/pruned are decided before)
    timing: Optional[Timing] = None  # None unless ok
    rel_error: Optional[float] = None
    error: Optional[str] = None


@dataclass(frozen=True)
class BaselineMeasurement(Timed):
    impl: str  # e.g. sdpa_flash, sdpa_cudnn, sdpa_efficient
    timing: Timing
    warnings: int = 0  # raised while it was built and timed, written to the baselines' log (runtime.baseline_log)


@dataclass(frozen=True)
class ConfirmTimings:
    """The confirm stage's figures: median µs of each implementation (variant names, baseline impls)
    in each interleaved round, all timed in one process on one card; beside them, aligned round by
    round, the Energy of each (None where not read) and, for --objective isolated, the µs of isolated
    calls (empty: not timed)."""

    rounds: dict[str, tuple[float, ...]]
    energy: dict[str, tuple[Optional[Energy], ...]] = field(default_factory=dict)
    isolated_us: dict[str, tuple[Optional[float], ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, timed: Mapping[str, Sequence[Timing]]) -> "ConfirmTimings":
        """From each implementation's Timing per round (runtime.timing.interleaved_timings)."""
        isolated = {name: tuple(t.isolated_us for t in ts) for name, ts in timed.items()}
        return cls({name: tuple(t.median_us for t in ts) for name, ts in timed.items()},
                   {name: tuple(t.energy for t in ts) for name, ts in timed.items()},
                   isolated if any(i is not None for ts in isolated.values() for i in ts) else {})


@dataclass(frozen=True)
class DeviceFacts:
    """What a run records about the card it measured on."""

    gpu_name: str
    gpu_uuid: Optional[str] = None
    driver: Optional[str] = None
    cuda_version: Optional[str] = None


class PendingMeasurement(Protocol):
    """A measurement under way on the backend's device; result() waits for it (once, then cached)."""

    seconds: float  # from sending it to collecting its reply: the time the device had it in hand

    def result(self) -> Measurement: ...


@dataclass(frozen=True)
class Measured:
    """A measurement already taken (backends that answer at once)."""

    measurement: Measurement
    seconds: float = 0.0

    def result(self) -> Measurement:
        return self.measurement


def submit_measure(backend: "Backend", problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                   range_prefix: str = "") -> PendingMeasurement:
    """Start measuring `built`: the GPU backend returns as soon as the request is sent, so the search
    asks and stores while the card works; other backends measure now."""
    submit = getattr(backend, "submit_measure", None)
    if submit is not None:
        return submit(problem, variant, built, range_prefix=range_prefix)
    started = time.perf_counter()
    measurement = backend.measure(problem, variant, built, range_prefix=range_prefix)
    return Measured(measurement, time.perf_counter() - started)


class Backend(Protocol):
    def device_facts(self) -> DeviceFacts: ...

    def baselines(self, problem: Problem) -> list[BaselineMeasurement]: ...

    def measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                range_prefix: str = "") -> Measurement:
        """Verify then time `built` (None for a backend whose `needs_compile` is False);
        `range_prefix` names the NVTX ranges (run/trial)."""
        ...

    def confirm(self, problem: Problem, variants: list[Variant], builts: list[Optional[BuiltKernel]],
                rounds: int, *, baselines: Optional[Collection[str]] = None, first_round: int = 0,
                energy_pass: bool = False) -> ConfirmTimings:
        """Time the variants and the baselines named (None: every one the backend has) in `rounds`
        interleaved rounds, numbered from `first_round` (the first call of a round rotates with it); a variant
        that is not correct on fresh inputs, or that the backend cannot time, is left out. Energy comes where
        objective.metered reads it: every round under --objective energy, else the `energy_pass` only (the
        confirm stage's winner and its baseline, after the race)."""
        ...

    def close(self) -> None: ...
