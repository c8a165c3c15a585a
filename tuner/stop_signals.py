"""SIGINT and SIGTERM of the `tuner` command: at any moment one line and exit 128 + the signal (130, 143).

Installed first thing by the entry point (tuner.__main__), before the CLI's imports, so a signal in the
first second is no traceback (SIGINT) or silent death (SIGTERM's default). Until a command takes over, the
first stop signal raises Stopped (a KeyboardInterrupt, so every `except KeyboardInterrupt` cleanup runs,
SIGTERM's too) and the entry point turns it into one line. A search defers them (`deferred`): the first
stops it after the current trial, nothing lost. Signals after the first one raised are ignored here:
the process is already unwinding, and an exception raised inside that (a store closing) would print a
traceback and lose what was being stored.
"""

from __future__ import annotations

import _signal as signal  # `signal` itself imports enum (16 ms): the entry point imports this module first
import sys
from collections.abc import Callable
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the stop signals this process got, in order
_scope = {"deferring": False, "abortable": False}  # inside `deferred`; a second signal may still abort


class Stopped(KeyboardInterrupt):
    """A stop signal raised as an exception."""


def note(signum: int) -> int:
    """Record a stop signal; returns how many this process has had."""
    _received.append(signum)
    return len(_received)


def first() -> int | None:
    """The first stop signal this process got, if any."""
    return _received[0] if _received else None


def exit_code() -> int:
    """128 + the first stop signal (130 for SIGINT, 143 for SIGTERM; 130 when stopped otherwise)."""
    return 128 + (first() or signal.SIGINT)


def pending() -> int | None:
    """The first stop signal a `deferred` scope has recorded (None outside one: nothing to carry on)."""
    return first() if _scope["deferring"] else None


def work_done() -> None:
    """The work a second signal would abort has ended (its results stored): later signals are ignored."""
    _scope["abortable"] = False


def reset() -> None:
    """Forget the signals received (tests that run the CLI in one process several times)."""
    _received.clear()


def _raise_first(signum: int, frame: FrameType | None) -> None:
    if note(signum) == 1:
        raise Stopped(signum)


def install() -> None:
    """Raise the first stop signal as Stopped, ignore later ones (main thread only)."""
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _raise_first)
    except ValueError:  # not the main thread: signals are the main thread's
        pass


def ignore() -> None:
    """Ignore stop signals from now on: the command is over and its exit code decided. (At shutdown the
    interpreter puts a Python handler back to the default, so a Ctrl-C then killed the process, rc -2;
    an ignored signal stays ignored.)"""
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def stopped_line() -> str:
    return "interrupted by SIGTERM" if first() == signal.SIGTERM else "aborted"


def exit_stopped() -> None:
    """One line on stderr, then exit 128 + the signal (the end of a command a stop signal cut short)."""
    try:
        sys.stderr.write(stopped_line() + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed (a killed terminal): the exit code still says it
        pass
    sys.exit(exit_code())


class deferred:
    """While entered, the first stop signal is only recorded (the work in hand checks `first()`, e.g. a
    search's stop flag, and ends cleanly); a second raises Stopped (abort) until `work_done()`; later
    ones are ignored. Main thread only (elsewhere it does nothing)."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.say = say
        self.previous: dict[int, object] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        count = note(signum)
        if count == 1 and self.say is not None:
            self.say("stopping after the current trial (Ctrl-C again to abort it)")
        elif count > 1 and _scope["abortable"]:
            _scope["abortable"] = False
            raise Stopped(signum)

    def __enter__(self) -> "deferred":
        reset()  # this command's signals (tests run several in one process)
        try:
            self.previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        except ValueError:  # not the main thread
            return self
        _scope.update(deferring=True, abortable=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.previous:
            _scope.update(deferring=False, abortable=False)
        for sig, old in self.previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
