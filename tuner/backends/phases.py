"""The phases of a GPU worker's request, by what bounds them.

Before each phase the child reports it (("phase", name, kind)), and the parent waits at most, for the next
message:
- KERNEL: the watchdog: a kernel's own launch and its synchronize (the verify launch); a hang is caught here;
- TIMED: the watchdog plus the timing budget: timed repetitions, the confirm stage's rounds;
- SETUP: the set-up limit, which grows with the problem (tuner.runtime.fixed_costs.setup_seconds): its inputs
  and fp32 reference, the error and the inputs' checksum after a verify launch, the baselines' imports and
  first calls. Seconds at long sequences, which must never be mistaken for a hung kernel.
"""

from __future__ import annotations

from typing import Any

KERNEL, TIMED, SETUP = "kernel", "timed", "setup"
PHASE_KINDS = (KERNEL, TIMED, SETUP)


def phase_kind(kind: Any) -> str:
    """A phase's kind (PHASE_KINDS); the older boolean `long` reads as TIMED (True) or KERNEL (False)."""
    if isinstance(kind, bool) or kind is None:
        return TIMED if kind else KERNEL
    if kind not in PHASE_KINDS:
        raise ValueError(f"unknown phase kind {kind!r}; expected one of {', '.join(PHASE_KINDS)}")
    return kind
