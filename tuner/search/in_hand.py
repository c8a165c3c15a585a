"""The trials a worker holds between asking and telling: asked ahead (compiling), and on the GPU."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional

from optuna.trial import Trial

from tuner.backends.base import Measurement, PendingMeasurement
from tuner.kernels.compiler import CompileResult
from tuner.kernels.feasibility import Feasibility
from tuner.kernels.variant import Variant


@dataclass
class Pending:
    """An asked point on its way to the GPU."""

    trial: Trial
    variant: Variant
    feasibility: Feasibility
    compile: Optional[Future] = None
    wait_for: Optional[int] = None  # number of another worker's running trial of the same variant
    stage: str = "asked ahead"  # where it is, for a trial the search stops before it is told
    repeat: bool = False  # a point this study already holds: told from the store, free


@dataclass
class InFlight:
    """A trial sent to the GPU worker, its reply not handled yet."""

    item: Pending
    handle: PendingMeasurement
    compiled: Optional[CompileResult]
    measurement: Optional[Measurement] = None  # the reply, once collected
    waited: float = 0.0  # seconds the worker was held up waiting for the reply

    def collect(self) -> Measurement:
        """The reply, the time spent waiting for it added to `waited`: what the card's work did not hide
        behind the worker's own (asking the sampler, storing results), the search's MEASURING phase."""
        started = time.perf_counter()
        try:
            return self.handle.result()
        finally:
            self.waited += time.perf_counter() - started
