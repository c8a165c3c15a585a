"""Several devices: one worker process each, driven from the parent (progress, errors, Ctrl-C).

A worker process enters through tuner.search.worker_entry, which starts its GPU child before anything
heavy is imported; the body of a worker is tuner.search.workers.child_main.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue as queue_module
import signal
import threading
from typing import Any, Callable, Optional, Sequence

from tuner.errors import TunerError
from tuner.search.job import Events, WorkerResult
from tuner.search.progress import SearchProgress
from tuner.search.worker_entry import worker_process_main
from tuner.search.workers import SigintHandler, WorkerSpec


class EscalateOnSigint(SigintHandler):
    """SIGINT in the parent of worker processes: the first sets `flag` (every worker stops after its
    current trial), a second terminates the children (each aborts its trial in flight), later ones kill them."""

    def __init__(self, flag: Any, procs: Sequence[Any], say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.procs, self.say, self.previous = flag, procs, say, None
        self.presses = 0

    @property
    def aborted(self) -> bool:
        return self.presses > 1

    def _handler(self, signum: int, frame: Any) -> None:
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
    """Drain `events` until every worker process has exited; returns results and errors by worker.

    `workers`: (worker id, device, process). The first error sets `stop` so the others end after
    their current trial. Draining goes on until all processes are gone: a child whose queue buffer
    is not flushed into the pipe cannot exit, so nobody may stop reading while one still runs.
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
        if all(not p.is_alive() for _, _, p in workers) and len(finished) == len(workers):
            return results, errors


def run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None]) -> list[WorkerResult]:
    """One worker process per device; their events drive the progress bars."""
    ctx = multiprocessing.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=worker_process_main, name=f"tuner-worker-{spec.device}",
                         args=(spec.device, spec.profile if spec.backend == "gpu" else None, pickle.dumps(spec),
                               events, stop))
             for spec in specs]
    # Children start with SIGINT ignored (inherited through exec; Python keeps an ignored SIGINT),
    # so a Ctrl-C during their start-up cannot kill them: only the parent handles it.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for proc in procs:
            proc.start()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    sigint = EscalateOnSigint(stop, procs, say)
    try:
        with sigint:
            results, errors = collect(events, [(s.worker, s.device, p) for s, p in zip(specs, procs)],
                                      progress.handle, stop)
    finally:
        for proc in procs:
            if proc.is_alive():  # only after an exception in the parent: don't leave children behind
                stop.set()
                proc.terminate()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if errors and not sigint.aborted:  # after an abort, terminated children are no error
        raise TunerError(errors[0])
    return [results.get(s.worker, WorkerResult(interrupted=True)) for s in specs]


