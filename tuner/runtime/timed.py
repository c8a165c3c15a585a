"""One timing as one value, from the GPU worker that measures it to the store that keeps it.

A `Timing` is what time_cuda measured of one implementation: the median and spread of back-to-back
calls, how many, their Energy when the meter read it, and the median of isolated calls when asked.
The GPU child sends it whole over its pipe; measurements, store records and rows carry it whole
(`timing`), and the store maps it to the columns of its table with SQLAlchemy's composite()
(tuner.store.models). `Timed` gives what carries one its figures to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tuner.runtime.energy import Energy, energy_of


@dataclass(frozen=True)
class Timing:
    """One implementation timed back to back (runtime.timing.time_cuda).

    p20_us / p80_us: the spread (None only in rows stored without it); reps: the repetitions timed
    (None when read back from a store, which does not keep it); energy: None where the meter was not
    read (a search's trials are timed without it unless the objective is energy) or NVML is missing;
    isolated_us: the median of isolated calls, timed for --objective isolated only."""

    median_us: float
    p20_us: Optional[float] = None
    p80_us: Optional[float] = None
    reps: Optional[int] = None
    energy: Optional[Energy] = None
    isolated_us: Optional[float] = None

    # The columns a store keeps it in, in this order (tuner.store.models maps them with composite()).
    COLUMNS = ("median_us", "p20_us", "p80_us", "joules_per_call", "power_w", "sm_mhz", "isolated_us")

    def __composite_values__(self) -> tuple[Optional[float], ...]:
        e = self.energy
        return (self.median_us, self.p20_us, self.p80_us, e.joules_per_call if e else None,
                e.power_w if e else None, e.sm_mhz if e else None, self.isolated_us)

    @classmethod
    def from_columns(cls, median_us: Optional[float], p20_us: Optional[float], p80_us: Optional[float],
                     joules_per_call: Optional[float], power_w: Optional[float], sm_mhz: Optional[float],
                     isolated_us: Optional[float]) -> Optional["Timing"]:
        """The Timing a row's COLUMNS hold; None for a row without one (a failed trial's median is NULL)."""
        if median_us is None:
            return None
        return cls(median_us, p20_us, p80_us, None, energy_of(joules_per_call, power_w, sm_mhz), isolated_us)


class Timed:
    """The figures of a `timing` (None where there is none): for the measurements and rows that carry one."""

    timing: Optional[Timing]

    @property
    def median_us(self) -> Optional[float]:
        return self.timing.median_us if self.timing is not None else None

    @property
    def p20_us(self) -> Optional[float]:
        return self.timing.p20_us if self.timing is not None else None

    @property
    def p80_us(self) -> Optional[float]:
        return self.timing.p80_us if self.timing is not None else None

    @property
    def energy(self) -> Optional[Energy]:
        return self.timing.energy if self.timing is not None else None

    @property
    def isolated_us(self) -> Optional[float]:
        return self.timing.isolated_us if self.timing is not None else None
