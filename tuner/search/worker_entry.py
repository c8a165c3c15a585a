"""The worker processes of a several-card search, started before anything heavy is imported.

Kept light on purpose (nothing of Optuna, SQLAlchemy or the CLI): `tuner search --devices 0,1` starts
its worker processes from the command line itself (tuner.early_start), before the CLI is imported.
Each process starts its GPU child at once, whose torch import and CUDA context (4-7 s) then overlap the
parent's imports (~2 s), its driver query (~1 s) and the studies' preparation; the worker's own imports
(the search modules, ~2 s) follow while it waits for its spec, which arrives pickled through its inbox.
"""

from __future__ import annotations

import atexit
import pickle
import signal
import threading
from typing import Any, Optional, Sequence


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def worker_process_main(device: int, gpu: bool, inbox: Any, events: Any, stop: Any) -> None:
    """Start the GPU child of `device` (gpu False: not the GPU backend), then run the worker on the spec
    `inbox` brings (None, or the parent gone: the search ended before it had work for this worker)."""
    # First of all: Ctrl-C reaches the whole process group but is the parent's to handle (it sets
    # `stop`); the parent's SIGTERM (a second Ctrl-C) aborts, as an exception, so the worker stores
    # what it was doing and the GPU child started below is stopped on the way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    if gpu:
        from tuner.backends.gpu_process import prestart

        prestart(device)
    import tuner.search.workers  # noqa: F401 - Optuna, SQLAlchemy (~2 s): while the parent prepares the studies

    try:
        spec = inbox.recv()
    except (EOFError, OSError):
        spec = None
    if spec is None:
        if gpu:
            from tuner.backends.gpu_process import discard_prestarted

            discard_prestarted(device)
        return
    from tuner.search.workers import child_main

    child_main(pickle.loads(spec), events, stop)


class StartedWorkers:
    """One worker process per device, started before their work is known. `give` hands each its spec;
    `discard` ends those never given one; `end` makes sure none is left running."""

    def __init__(self, devices: Sequence[int], gpu: bool) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.devices, self.gpu = tuple(devices), gpu
        self.events, self.stop = ctx.Queue(), ctx.Event()
        pipes = [ctx.Pipe(duplex=False) for _ in self.devices]  # the child holds only the reading end:
        self.inboxes = [writer for _, writer in pipes]  # it sees EOF if this process dies first
        self.procs = [ctx.Process(target=worker_process_main, name=f"tuner-worker-{device}",
                                  args=(device, gpu, reader, self.events, self.stop))
                      for device, (reader, _) in zip(self.devices, pipes)]
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
        for reader, _ in pipes:
            reader.close()

    def give(self, specs: Sequence[Any]) -> None:
        """Send worker i its spec (pickled here: the search modules are loaded by now)."""
        self.given = True
        for inbox, spec in zip(self.inboxes, specs):
            try:
                inbox.send(pickle.dumps(spec))
            except (OSError, ValueError):  # that process died early: collect() reports it, the others stop
                self.stop.set()

    def discard(self) -> None:
        """End processes that were never given work (the search stopped before its workers ran)."""
        if self.given:
            return
        self.given = True
        for inbox in self.inboxes:
            try:
                inbox.send(None)
            except (OSError, ValueError):
                pass
        self.end(10.0)

    def end(self, wait_s: float = 0.0) -> None:
        """Wait up to `wait_s` for each process to exit on its own, then terminate (later kill) the others."""
        for proc in self.procs:
            if wait_s:
                proc.join(wait_s)
            if proc.is_alive():  # an exception in the parent, or a worker that does not end: none is left behind
                self.stop.set()
                proc.terminate()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


# Worker processes started from the command line (tuner.early_start), until the search adopts them.
_early: Optional[StartedWorkers] = None


def start_early(devices: Sequence[int], gpu: bool) -> None:
    """Start the worker processes of `devices` now; the search adopts them (adopt_early). At exit,
    those never adopted are ended (a bad option, an unknown profile: the search never ran)."""
    global _early
    if _early is None:
        _early = StartedWorkers(devices, gpu)
        atexit.register(_discard_early)  # after multiprocessing's own handler, so it runs before it


def adopt_early(devices: Sequence[int], gpu: bool) -> Optional[StartedWorkers]:
    """The early worker processes, if they were started for these devices and backend (else they end)."""
    global _early
    started, _early = _early, None
    if started is not None and (started.devices, started.gpu) != (tuple(devices), gpu):
        started.discard()
        return None
    return started


def _discard_early() -> None:
    if _early is not None:
        _early.discard()
