"""What a search minimizes (`tuner search --objective`), and each objective's figure of a timing.

- time (the default): the median µs of back-to-back calls, the card at its power limit, as in a
  model's forward pass;
- energy: the joules per call of those back-to-back calls (tuner.runtime.energy): at the power limit
  a kernel's speed is its work per joule, and a deployment pays for the joules;
- isolated: the median µs of isolated calls (each after a host synchronize, the card idle and at its
  boost clock in between): the latency of a call made now and then.

Every timing keeps its back-to-back µs (median_us) whatever the objective; energy and the isolated
µs come beside it, so figures of searches with different objectives never mix. Energy is read where it
decides (`metered`): a metered timing runs 0.5 s at least, 4-8x an unmetered one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from tuner.errors import TunerError

TIME, ENERGY, ISOLATED = "time", "energy", "isolated"
OBJECTIVES = (TIME, ENERGY, ISOLATED)
DEFAULT_OBJECTIVE = TIME
# The stored column of each objective's figure (trials, baselines, confirm timings).
COLUMN = {TIME: "median_us", ENERGY: "joules_per_call", ISOLATED: "isolated_us"}
UNIT = {TIME: "µs", ENERGY: "J/call", ISOLATED: "µs isolated"}
# What the GPU worker times: a search's trials, the baselines a study starts with, the confirm stage's rounds.
TRIAL, BASELINE, CONFIRM = "trial", "baseline", "confirm"
ENERGY_PASS = "energy pass"  # after the confirm stage's race: the J per call of its winner and that one's baseline
# time_cuda's window of each stage, (warm-up ms, repetitions ms), back to back. A search's figures (its trials
# and the baselines they are set beside) only rank variants for the confirm stage, which re-times its candidates
# and the baselines in interleaved rounds: half the window serves them (drift between calls, up to 5%, dwarfs the
# spread of a median over 50 ms of repetitions) and cuts most of a trial's cost (issue 38). A burst's length moves
# its reading by a few percent, so the two windows' figures never compare with each other: confirm ratios are
# within the confirm stage's rounds, a trial's "x baseline" within the search's window.
WINDOW_MS = {TRIAL: (10.0, 50.0), BASELINE: (10.0, 50.0), CONFIRM: (25.0, 100.0), ENERGY_PASS: (25.0, 100.0)}


def timing_window(stage: str) -> dict[str, float]:
    """time_cuda's warmup_ms and rep_ms for a timing of `stage` (TRIAL, BASELINE, CONFIRM, ENERGY_PASS)."""
    warmup_ms, rep_ms = WINDOW_MS[stage]
    return {"warmup_ms": warmup_ms, "rep_ms": rep_ms}


def check_objective(name: Optional[str]) -> str:
    """The objective called `name` (None: time); a one-line TunerError for an unknown one."""
    key = (name or DEFAULT_OBJECTIVE).strip().lower()
    if key not in OBJECTIVES:
        raise TunerError(f"unknown objective {name!r}; expected one of {', '.join(OBJECTIVES)}")
    return key


def required_column(objective: str) -> Optional[str]:
    """The trials column a stored ok trial needs to answer a search with this objective (None: time,
    whose figure every ok trial has)."""
    return None if objective == TIME else COLUMN[objective]


def metered(objective: str, stage: str) -> bool:
    """Whether a timing of `stage` reads the energy meter. NVML's counter steps every ~100 ms, so a metered
    block runs at least 0.5 s (energy.MIN_WINDOW_S) where 0.06-0.125 s of back-to-back calls give the median:
    under --objective energy everything it ranks; otherwise only the confirm stage's energy pass (ENERGY_PASS):
    one block for the winner and one for the baseline its ratio is taken against, after the race, whose rounds
    decide on µs alone. (Metering the race's last round instead cost a 0.5 s block for every candidate and
    baseline still racing, 3-8 a problem, where 2 are kept.)"""
    return objective == ENERGY or stage == ENERGY_PASS


@dataclass
class ConfirmRounds:
    """The rounds one confirm request times, numbered from `first` (`count` of them); `energy_pass`: the request
    is the confirm stage's energy pass. `start(r)` as round r of the request begins (interleaved_timings'
    on_round), then `metered` says whether its timings read the meter (the GPU worker's, and the replay's as it)."""

    objective: str
    first: int
    count: int
    energy_pass: bool = False
    current: int = field(init=False)

    def __post_init__(self) -> None:
        self.current = self.first

    def start(self, r: int) -> None:
        self.current = self.first + r

    @property
    def metered(self) -> bool:
        return metered(self.objective, ENERGY_PASS if self.energy_pass else CONFIRM)


def figure(objective: str, timed: Any) -> Optional[float]:
    """The figure `objective` minimizes of a timing (a Measurement, BaselineMeasurement, TrialRow or
    BaselineRow: anything with median_us, energy and isolated_us), or None where it was not measured."""
    if objective == ENERGY:
        energy = getattr(timed, "energy", None)
        return energy.joules_per_call if energy is not None else None
    if objective == ISOLATED:
        return getattr(timed, "isolated_us", None)
    return timed.median_us


def shown(objective: str, value: float) -> str:
    """A figure of `objective` for people: 12.34 µs, 7.05 mJ (a kernel's call costs millijoules), 9.87 µs isolated."""
    if objective == ENERGY:
        return f"{value * 1e3:.3g} mJ"
    return f"{value:.2f} µs" + (" isolated" if objective == ISOLATED else "")
