"""What a worker is given and what it gives back: its jobs (a study each), its shared context, its counts."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

from tuner.backends.base import Backend
from tuner.profiles import GpuProfile
from tuner.search.hooks import Hooks
from tuner.store import Store

DUPLICATE_WAIT_S = 600.0  # longest wait for another worker measuring the same variant
MAX_LOOKAHEAD = 16  # most trials a worker asks ahead of the one it measures
MAX_INFEASIBLE_STREAK = 500  # infeasible points in a row after which a worker stops asking
MAX_UNMEASURABLE_STREAK = 100  # points in a row the backend could not measure (a replay not holding them)
MAX_REPEAT_STREAK = 200  # proposals of already measured points in a row after which it stops (space exhausted)

Events = Callable[[tuple], None]
WAITING_FOR_WORKERS = "waiting for other workers"  # a phase of the time breakdown: duplicates, last trials
# The phase of the time breakdown that waits for the backend's measures: the time a trial's reply kept the worker
# waiting, after what the worker did meanwhile (ASKING, STORING), which the card's work hides when it is longer.
MEASURING = "measuring (GPU worker)"
ASKING = "asking the sampler"  # Optuna's ask, and the points that need no GPU (infeasible, repeats), stored and told
STORING = "storing results"  # a measured trial's row and its tell
# The phase that waits for each request of the GPU worker (tuner.backends.gpu): its fixed costs come out of it.
CONFIRM_STAGE = "confirm stage"
REQUEST_PHASES = {"measure": MEASURING, "baselines": "baselines", "confirm": CONFIRM_STAGE}

@dataclass(frozen=True)
class WorkerJob:
    """One study for a worker: how many new trials it asks, and until when."""

    index: int  # position of the problem in the search (progress events)
    study: str
    trials: Optional[int]
    deadline: Optional[float] = None  # wall-clock time after which no trial is started
    beyond_budget: bool = False  # `trials` are asked on top of what the study holds (`tuner worker --trials N`)
    confirm: bool = True  # this worker runs the study's confirm stage (one worker per study does)


@dataclass
class WorkerResult:
    run_id: Optional[int] = None
    measured: int = 0  # trials the backend measured
    reused: int = 0  # trials served from the store, measured by an earlier run
    repeated: int = 0  # proposals of a variant this run measured already (answered from the store)
    asked: int = 0  # feasible points asked (the --trials budget counts these)
    infeasible: int = 0  # points pruned by the feasibility rules (stored, not budgeted)
    interrupted: bool = False
    exhausted: list[str] = field(default_factory=list)  # studies whose sampler proposed only held points
    stopped_early: dict[str, int] = field(default_factory=dict)  # study -> budgeted trials it held at the stop
    untuned: list[str] = field(default_factory=list)  # studies not started: the --time-budget was spent
    # Where the worker's wall time went (seconds): what `tuner search` prints as its time breakdown.
    seconds: dict[str, float] = field(default_factory=dict)

    def spent(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """spent(phase, the seconds the block takes)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.spent(phase, time.perf_counter() - started)

    def spent_within(self, parts: Mapping[tuple[Optional[str], str], float]) -> None:
        """Name the backend's fixed costs (seconds by (request, part): inputs, reference, verification, baseline
        set-up) in the breakdown, taken out of the phase that waited for their request (REQUEST_PHASES); a
        part of no request (a GPU worker's restart) is a phase of its own."""
        for (request, part), seconds in parts.items():
            within = REQUEST_PHASES.get(request or "")
            if within is not None:
                seconds = min(seconds, self.seconds.get(within, 0.0))
                self.seconds[within] = self.seconds.get(within, 0.0) - seconds
            self.spent(part, seconds)


def point(params: dict[str, Any]) -> tuple:
    """A point of the space, hashable (the same variant whatever order the sampler gave)."""
    return tuple(sorted(params.items()))


@dataclass
class Context:
    """What every trial of a worker shares."""

    store: Store
    backend: Backend
    run_id: int
    profile: GpuProfile
    gpu_name: str
    compile_pool: Optional[ThreadPoolExecutor]
    stop: Any  # threading.Event or multiprocessing.Event
    events: Events
    hooks: Hooks = field(default_factory=Hooks)
    result: WorkerResult = field(default_factory=WorkerResult)
    objective: str = "time"  # what the worker's studies minimize (tuner.runtime.objective)
    replayed_from: Optional[str] = None  # a replay's recording (redacted URL): reuse answers of it alone

    def interrupt(self) -> None:
        """Ctrl-C reached this worker: stop, and say so in its result."""
        self.stop.set()
        self.result.interrupted = True


def lookahead_for(pool: Optional[ThreadPoolExecutor]) -> int:
    """Trials asked ahead: enough to keep the compile pool busy, capped (each asked trial is a
    pending point the sampler must lie about)."""
    return min(pool._max_workers + 1, MAX_LOOKAHEAD) if pool is not None else 1
