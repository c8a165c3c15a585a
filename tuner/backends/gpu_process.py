"""The GPU worker's child process from the parent's side: started, awaited, stopped; started early.

A child is started at construction and awaited (`wait_ready`) before its first request, so a caller
can start it ahead of need: `prestart()` at the top of a search (before the GPU profile is known: the
child warms up, then takes its options from the backend that adopts it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import time
from typing import Any, Callable, Iterator, Optional

from tuner.backends.gpu_child import Runner, RunnerOptions, child_main, default_runner
from tuner.backends.phases import KERNEL, SETUP, TIMED, phase_kind
from tuner.errors import NoGpuError, TunerError
from tuner.profiles import GpuProfile, visible_gpu_count


class _Refused(TunerError):
    """The child answered a request with an error (e.g. an unreadable cubin) and lives on."""


class _Timeout(Exception):
    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no reply from the GPU worker within {seconds:.1f} s (phase {phase}); worker killed")
        self.phase = phase


class _Fault(Exception):
    pass


class _Worker:
    """One child process and its end of the pipe. Started at construction; wait_ready() before first use."""

    def __init__(self, factory: Callable[[RunnerOptions], Runner], options: Optional[RunnerOptions],
                 device: int = 0) -> None:
        """`options` None: the child warms up on `device` until configure() sends them."""
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=child_main, args=(child_conn, factory, options, device), daemon=True,
                                   name="tuner-gpu-worker")
        self.process.start()
        child_conn.close()
        self.device = options.device if options is not None else device
        self.configured = options is not None
        self.ready = False
        self.op: Optional[str] = None  # the request sent last
        self.setup_s: Optional[float] = None  # the limit on the set-up phases of the request sent last
        # Seconds of the child's fixed costs by (request, part), from its ("spent", {part: seconds}) messages.
        self.spent: dict[tuple[Optional[str], str], float] = {}

    def configure(self, options: RunnerOptions) -> None:
        """Send the options to a child started without them (once); a child that died meanwhile says why
        in wait_ready."""
        if self.configured:
            return
        self.configured = True
        try:
            self.conn.send(("options", options))
        except (OSError, ValueError):
            pass

    def wait_ready(self, start_timeout_s: float) -> None:
        """Wait for the child's "ready" (torch imported, CUDA context bound); TunerError (killed) if it fails."""
        if self.ready:
            return
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise TunerError(f"the GPU worker did not start within {start_timeout_s:.0f} s")
        try:
            kind, message = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise TunerError(f"the GPU worker died while starting (exit code {self.process.exitcode})") from None
        if kind == "nogpu":
            self.kill()
            raise NoGpuError(message)
        if kind == "refused":
            self.kill()
            raise TunerError(message)
        if kind != "ready":
            self.kill()
            raise TunerError(f"the GPU worker could not start: {message}")
        self.ready = True

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def send(self, op: str, args: dict[str, Any], setup_s: Optional[float] = None) -> None:
        """Send one request (`setup_s`: the limit on its set-up phases, see receive); a _Fault leaves this
        worker dead."""
        self.op, self.setup_s = op, setup_s
        try:
            self.conn.send((op, args))
        except (OSError, ValueError) as exc:
            self.kill()
            raise _Fault(f"the GPU worker is gone ({exc})") from None

    def receive(self, watchdog_s: float, long_budget_s: float) -> Any:
        """The reply to the request sent last. The limit restarts with each phase the child reports, by the
        phase's kind (tuner.backends.phases): a kernel's launch `watchdog_s`, timed repetitions `watchdog_s` +
        `long_budget_s`, set-up work (inputs, reference, error, baselines' set-up) the request's `setup_s`
        (without one: the two together, as a timed phase)."""
        setup_s = self.setup_s if self.setup_s is not None else watchdog_s + long_budget_s
        limits = {KERNEL: watchdog_s, TIMED: watchdog_s + long_budget_s, SETUP: setup_s}
        phase, budget = "start", watchdog_s
        deadline = time.monotonic() + budget
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.conn.poll(remaining):
                self.kill()
                raise _Timeout(phase, budget)
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.kill()
                raise _Fault(f"the GPU worker died (exit code {self.process.exitcode}) in phase {phase}") from None
            kind = message[0]
            if kind == "phase":
                phase, budget = message[1], limits[phase_kind(message[2])]
                deadline = time.monotonic() + budget
            elif kind == "spent":
                for part, seconds in message[1].items():
                    self.spent[(self.op, part)] = self.spent.get((self.op, part), 0.0) + seconds
            elif kind == "result":
                return message[1]
            elif kind == "error":
                raise _Refused(message[1])
            elif kind == "fault":
                self.process.join(10)
                self.kill()
                raise _Fault(f"{message[1]} (phase {phase})")
            else:
                self.kill()
                raise _Fault(f"unexpected message from the GPU worker: {kind!r}")

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: a hung kernel ignores anything gentler
        self.process.join(30)
        self.conn.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the child to leave (its exit flushes what profilers such as nsys collected); kill it past timeout_s."""
        if self.process.is_alive():
            try:
                self.conn.send(("stop", {}))
            except (OSError, ValueError):
                pass
            self.process.join(timeout_s)
        self.kill()


def runner_options(profile: GpuProfile, device: int, seed: Optional[int] = None,
                   objective: str = "time") -> RunnerOptions:
    """What a GPU worker child of `device` is started with (and a prestarted child is matched by)."""
    return RunnerOptions(device=device, l2_bytes=profile.l2_bytes, seed=seed, objective=objective)


# Children started ahead of their backend (prestart), by (device, runner factory), without their
# options: the first GpuBackend of that device and factory adopts one and sends them.
_prestarted: dict[tuple[int, Callable[..., Any]], _Worker] = {}


def prestart(device: int = 0, runner: Optional[Callable[[RunnerOptions], Runner]] = None) -> None:
    """Start the GPU worker child of `device` now and return at once. Its torch import and CUDA context
    (4-7 s on an H100 host, the largest fixed cost of a search) then overlap the caller's own start-up
    (imports, the GPU profile, studies, the store); the backend built later adopts the child and sends
    its options. Does nothing where the GPU environment is clearly missing (default runner): the backend
    says why when it is built."""
    factory = runner or default_runner
    if (device, factory) in _prestarted:
        return
    if runner is None and not gpu_environment_likely():
        return
    _prestarted[(device, factory)] = _Worker(factory, None, device)


def adopt_prestarted(options: RunnerOptions, factory: Callable[..., Any]) -> Optional[_Worker]:
    """The prestarted child of this device and factory, given `options`, if one is alive (a dead one is reaped)."""
    worker = _prestarted.pop((options.device, factory), None)
    if worker is not None and not worker.process.is_alive():
        worker.kill()  # died before it was needed (e.g. Ctrl-C while starting): the caller starts afresh
        return None
    if worker is not None:
        worker.configure(options)
    return worker


@contextlib.contextmanager
def started_early(device: int, enabled: bool = True) -> Iterator[None]:
    """prestart() the GPU child of `device` on entry (when `enabled`); on exit, stop it if nothing adopted it
    (the work inside ended before it built its backend)."""
    if enabled:
        prestart(device)
    try:
        yield
    finally:
        if enabled:
            discard_prestarted(device)


def discard_prestarted(device: int = 0, runner: Optional[Callable[[RunnerOptions], Runner]] = None) -> None:
    """Stop the child prestart() started for `device` if no backend adopted it (the search ended early)."""
    worker = _prestarted.pop((device, runner or default_runner), None)
    if worker is not None:
        worker.kill()


def gpu_environment_likely() -> bool:
    """A cheap guess (no driver call: cuInit alone takes ~1 s) that a GPU child can start here."""
    return (importlib.util.find_spec("torch") is not None and importlib.util.find_spec("pycuda") is not None
            and os.path.exists("/dev/nvidiactl"))


def check_gpu_environment() -> None:
    """What the GPU worker needs, checked without importing torch (that costs a worker process seconds;
    the worker imports it itself)."""
    if importlib.util.find_spec("torch") is None:
        raise NoGpuError("torch is not installed")
    if visible_gpu_count() == 0:
        raise NoGpuError("no usable CUDA GPU on this machine (the CUDA driver reports none)")
    if importlib.util.find_spec("pycuda") is None:
        raise NoGpuError("pycuda is not installed; install the gpu extra: pip install 'flashcore-tuner[gpu]'")
