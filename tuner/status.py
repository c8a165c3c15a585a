"""The outcome of one trial: every layer (backends, search, store, reports) speaks it."""

from __future__ import annotations

from enum import Enum

from tuner.errors import TunerError


class TrialStatus(str, Enum):
    """Outcome of one trial; a failed trial is a result, not an exception."""

    OK = "ok"
    PRUNED = "pruned"  # rejected by the feasibility check before compiling
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    TIMEOUT = "timeout"
    INCORRECT = "incorrect"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: "TrialStatus | str") -> "TrialStatus":
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(member.value for member in cls)
            raise TunerError(f"unknown trial status {value!r}; expected one of {choices}") from None
