"""Several devices: one worker process each, driven from the parent (progress, errors, Ctrl-C).

A worker process enters through tuner.search.worker_entry, which starts its GPU child before anything
heavy is imported, then waits for its spec; the body of a worker is tuner.search.workers.child_main.
The processes are started by the command line itself (tuner.early_start) or at the top of run_search.
"""

from __future__ import annotations

import contextlib
import queue as queue_module
from typing import Any, Callable, Iterator, Optional, Sequence

from tuner import stop_signals
from tuner.errors import TunerError
from tuner.search.job import Events, WorkerResult
from tuner.search.progress import SearchProgress
from tuner.search.worker_entry import StartedWorkers, adopt_early
from tuner.search.workers import SigintHandler, WorkerSpec


class EscalateOnSigint(SigintHandler):
    """SIGINT in the parent of worker processes: the first sets `flag` (every worker stops after its
    current trial), a second terminates the children (each aborts its trial in flight), later ones kill them."""

    def __init__(self, flag: Any, procs: Sequence[Any], say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.procs, self.say, self.previous = flag, procs, say, None
        self.presses = 0

    def __enter__(self) -> "EscalateOnSigint":
        super().__enter__()
        if self.flag.is_set():  # signalled while the search was prepared: that was the first press
            self.presses = max(self.presses, 1)
        return self

    @property
    def aborted(self) -> bool:
        return self.presses > 1

    def _handler(self, signum: int, frame: Any) -> None:
        stop_signals.note(signum)  # the exit code names the first signal
        self.presses += 1
        if self.presses == 1:
            self.flag.set()
            if self.say:
                self.say("stopping after the current trial (Ctrl-C again to abort it)")
            return
        if self.say and self.presses == 2:
            self.say("aborting the trials in flight")
        for proc in self.procs:
            if not proc.is_alive():
                continue
            if self.presses == 2:
                proc.terminate()
            else:
                proc.kill()


def collect(events: Any, workers: Sequence[tuple[int, int, Any]], handle: Events, stop: Any,
            poll_s: float = 0.2) -> tuple[dict[int, WorkerResult], list[str]]:
    """Drain `events` until every worker process has reported (done or error) or died; returns results and
    errors by worker.

    `workers`: (worker id, device, process). The first error sets `stop` so the others end after
    their current trial. A worker reports last of all (its GPU child shuts down after), so nothing is
    left unread in its queue once it has reported.
    """
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    finished: set[int] = set()

    def take(event: tuple) -> None:
        if event[0] == "done":
            results[event[1]] = event[2]
            finished.add(event[1])
        elif event[0] == "error":
            errors.append(event[2])
            results.setdefault(event[1], WorkerResult(interrupted=True))
            finished.add(event[1])
            stop.set()
        else:
            handle(event)

    while True:
        try:
            take(events.get(timeout=poll_s))
            continue
        except queue_module.Empty:
            pass
        # Exited first, queue second: what an exited child put is in the pipe by now.
        gone = [(w, d, p) for w, d, p in workers if w not in finished and not p.is_alive()]
        while True:
            try:
                take(events.get_nowait())
            except queue_module.Empty:
                break
        for worker, device, proc in gone:
            if worker not in finished:  # died without a word (killed, segfault)
                errors.append(f"worker on device {device} died (exit code {proc.exitcode})")
                results[worker] = WorkerResult(interrupted=True)
                finished.add(worker)
                stop.set()
        if len(finished) == len(workers):
            return results, errors


def run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None],
                  started: Optional[StartedWorkers] = None) -> list[WorkerResult]:
    """One worker process per device (those `started` ahead, else new ones); their events drive the bars.
    Worker i must have started on specs[i]'s device."""
    own = started is None
    if started is None:
        started = StartedWorkers([s.device for s in specs], specs[0].backend == "gpu")
    if [s.device for s in specs] != list(started.devices):
        started.discard()
        raise TunerError("worker specs do not match the devices the worker processes started on")
    sigint = EscalateOnSigint(started.stop, started.procs, say)
    try:
        with sigint:
            started.give(specs)
            results, errors = collect(started.events, [(s.worker, s.device, p) for s, p in zip(specs, started.procs)],
                                      progress.handle, started.stop)
    except BaseException:
        started.end()  # at once: don't leave children behind
        raise
    if own:  # else the caller's started_workers waits for them, after the report
        started.end(EXIT_WAIT_S)
    if errors and not sigint.aborted:  # after an abort, terminated children are no error
        raise TunerError(errors[0])
    return [results.get(s.worker, WorkerResult(interrupted=True)) for s in specs]


EXIT_WAIT_S = 30.0  # a worker's exit after its report: its GPU child's teardown (~1 s; profilers write there)


@contextlib.contextmanager
def started_workers(devices: Sequence[int], gpu: bool, enabled: bool = True) -> Iterator[Optional[StartedWorkers]]:
    """The worker processes of `devices` (when `enabled` and there are several): those the command line
    started (tuner.early_start), else started now; on exit, those never given work are ended."""
    started = None
    if enabled and len(devices) > 1:
        started = adopt_early(devices, gpu) or StartedWorkers(devices, gpu)
    try:
        yield started
    finally:
        if started is not None:
            started.discard()
            started.end(EXIT_WAIT_S)
