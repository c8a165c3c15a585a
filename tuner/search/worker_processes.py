"""Several devices: one worker process each, driven from the parent (progress, errors, Ctrl-C).

A worker process enters through tuner.search.worker_entry, which starts its GPU child before anything
heavy is imported, then waits for its spec; the body of a worker is tuner.search.workers.child_main.
`started_workers` starts them at the top of a search, before the studies are prepared.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue as queue_module
import signal
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

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


class WorkerProcesses:
    """One worker process per device, started before their work is known: each starts its GPU child at
    once, so the children's torch import and CUDA context overlap the parent preparing the studies (as
    prestart does for one card). `run` hands each its spec; `discard` ends those never given one."""

    def __init__(self, devices: Sequence[int], gpu_profile: Optional[str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.devices = tuple(devices)
        self.events, self.stop = ctx.Queue(), ctx.Event()
        self.inboxes = [ctx.SimpleQueue() for _ in self.devices]
        self.procs = [ctx.Process(target=worker_process_main, name=f"tuner-worker-{device}",
                                  args=(device, gpu_profile, inbox, self.events, self.stop))
                      for device, inbox in zip(self.devices, self.inboxes)]
        self.given = False
        # Children start with SIGINT ignored (inherited through exec; Python keeps an ignored SIGINT),
        # so a Ctrl-C during their start-up cannot kill them: only the parent handles it.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for proc in self.procs:
                proc.start()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def run(self, specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None]) -> list[WorkerResult]:
        """Give worker i specs[i] (its device must be the one it started on); their events drive the bars."""
        if [s.device for s in specs] != list(self.devices):
            raise TunerError("worker specs do not match the devices the worker processes started on")
        self.given = True
        for inbox, spec in zip(self.inboxes, specs):
            inbox.put(pickle.dumps(spec))
        sigint = EscalateOnSigint(self.stop, self.procs, say)
        try:
            with sigint:
                results, errors = collect(self.events, [(s.worker, s.device, p) for s, p in zip(specs, self.procs)],
                                          progress.handle, self.stop)
        finally:
            self._end()
        if errors and not sigint.aborted:  # after an abort, terminated children are no error
            raise TunerError(errors[0])
        return [results.get(s.worker, WorkerResult(interrupted=True)) for s in specs]

    def discard(self) -> None:
        """End processes that were never given work (the search stopped before its workers ran)."""
        if self.given:
            return
        self.given = True
        for inbox in self.inboxes:
            inbox.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
        self._end()

    def _end(self) -> None:
        for proc in self.procs:
            if proc.is_alive():  # only after an exception in the parent: don't leave children behind
                self.stop.set()
                proc.terminate()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


@contextlib.contextmanager
def started_workers(devices: Sequence[int], gpu_profile: Optional[str], enabled: bool = True
                    ) -> Iterator[Optional[WorkerProcesses]]:
    """Worker processes for `devices` started on entry (when `enabled` and there are several devices);
    on exit, those never given work are ended."""
    processes = WorkerProcesses(devices, gpu_profile) if enabled and len(devices) > 1 else None
    try:
        yield processes
    finally:
        if processes is not None:
            processes.discard()


def run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None],
                  processes: Optional[WorkerProcesses] = None) -> list[WorkerResult]:
    """One worker process per device (those started ahead by `started_workers`, else new ones)."""
    if processes is None:
        profile = specs[0].profile if specs[0].backend == "gpu" else None
        processes = WorkerProcesses([s.device for s in specs], profile)
    return processes.run(specs, progress, say)
