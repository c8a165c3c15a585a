"""Energy as a measurement: NVML's energy counter, SM clock and board power around a timed block.

Back to back, an H100 sits at its power limit (700 W) and its SM clock falls to 1250-1800 MHz;
idle between calls it stays at its boost clock (1980 MHz). At the limit a kernel's speed is its
work per joule, so every timed block (a trial, a baseline, a confirm round) records its energy
beside its time:

    meter = EnergyMeter(device=0)         # NVML opened on first use; never raises
    torch.cuda.synchronize(); meter.start()
    ...timed repetitions...
    torch.cuda.synchronize(); meter.end()  # the window closes here
    energy = meter.stop(calls=reps, median_us=median)

`energy` is None where NVML is missing or fails (the reason is logged once, and kept in
`meter.why_not`), or where the window was too short to measure: a measurement without energy is
still a measurement.

NVML's total-energy counter moves in steps, about every 100 ms (H200, driver 580; measured by
benchmarks/energy_probe.py): a 100 ms window holds one or two steps, and its delta read 500 or
1050 W for the same kernel at a 700 W limit. So the sampling thread records the host time of every
step it sees, and power is the slope between the first and the last step inside the window (at
least MIN_STEPS of them); a timed block with a meter runs for MIN_WINDOW_S at least (time_cuda).
nvmlDeviceGetPowerUsage is no substitute: on Ampere and later it is a one-second average, which
barely moved between 150 ms phases of heavy and light work where the instant field followed them.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

log = logging.getLogger(__name__)
SAMPLE_S = 0.005  # the sampling thread's period (SM clock, power, the energy counter's steps)
MIN_WINDOW_S = 0.5  # a metered block runs at least this long: 5+ counter steps, the slope within ~2%
MIN_STEPS = 3  # counter steps inside a window for a slope (2 intervals); fewer: the instant power, or none
_INSTANT_FIELD = "NVML_FI_DEV_POWER_INSTANT"  # nvidia-ml-py's name of the instantaneous board power field


@dataclass(frozen=True)
class Energy:
    """What a timed block cost the card.

    joules_per_call: the board power over the block times the median call time (see EnergyMeter.stop);
    power_w: mean board power over the block (energy-counter delta / wall time);
    sm_mhz: mean SM clock sampled during the block; window_ms: the block's wall time (None when read
    back from a store, which does not keep it)."""

    joules_per_call: float
    power_w: float
    sm_mhz: Optional[float]
    window_ms: Optional[float] = None

    def tflops_per_watt(self, tflops: Optional[float]) -> Optional[float]:
        """TFLOP/s per watt (= TFLOP per joule) of a kernel running at `tflops`."""
        return tflops / self.power_w if tflops is not None and self.power_w > 0 else None


def energy_of(joules_per_call: Optional[float], power_w: Optional[float], sm_mhz: Optional[float]) -> Optional[Energy]:
    """An Energy from stored columns (None when the row has none)."""
    if joules_per_call is None or power_w is None:
        return None
    return Energy(joules_per_call, power_w, sm_mhz)


def median_energy(samples: Iterable[Optional[Energy]]) -> Optional[Energy]:
    """The median of each figure over the samples that have energy (None when none has): a variant's or a
    baseline's over several timings (confirm rounds, recorded runs)."""
    found = [e for e in samples if e is not None]
    if not found:
        return None
    mhz = [e.sm_mhz for e in found if e.sm_mhz is not None]
    return Energy(statistics.median(e.joules_per_call for e in found), statistics.median(e.power_w for e in found),
                  statistics.median(mhz) if mhz else None)


def _handle_of(nvml: Any, device: int) -> Any:
    """The NVML handle of torch's device `device`: by UUID (torch and NVML may number the cards
    differently, e.g. under CUDA_VISIBLE_DEVICES), else by index."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device).uuid)
        uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        return nvml.nvmlDeviceGetHandleByUUID(uuid.encode())  # bytes: every nvidia-ml-py takes them
    except Exception:  # noqa: BLE001 - no uuid in this torch, or NVML does not know it
        return nvml.nvmlDeviceGetHandleByIndex(device)


class EnergyMeter:
    """Energy, SM clock and power of one device over a timed block (start() ... end() ... stop()).

    NVML (package nvidia-ml-py, module pynvml) is opened lazily, on the first use, in the process that
    times (the GPU worker). Where it is missing or fails, `available` is False, `why_not` says why
    (logged once), and stop() returns None."""

    min_window_s = MIN_WINDOW_S  # time_cuda runs a metered block at least this long

    def __init__(self, device: int = 0, sample_s: float = SAMPLE_S) -> None:
        self.device, self.sample_s = device, sample_s
        self.why_not: Optional[str] = None
        self._nvml: Any = None
        self._handle: Any = None
        self._instant: Optional[int] = None  # the instant-power field id, where this NVML has it
        self._opened = False
        self._thread: Optional[threading.Thread] = None
        self._halt = threading.Event()
        self._clocks: list[float] = []
        self._powers: list[float] = []  # instant board power samples (W)
        self._steps: list[tuple[float, float]] = []  # (host seconds, counter mJ) where the counter moved
        self._last_counter: Optional[float] = None
        self._start: Optional[float] = None  # host seconds
        self._window: Optional[tuple[Optional[float], float]] = None  # (watts, seconds) of the closed window

    @property
    def available(self) -> bool:
        self._open()
        return self._handle is not None

    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = _handle_of(pynvml, self.device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # not supported before Volta
            self._nvml, self._handle = pynvml, handle
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_*: no energy, never an error
            lines = str(exc).strip().splitlines()
            self.why_not = f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
            log.warning("energy is not measured on device %d (NVML: %s); measurements carry none",
                        self.device, self.why_not)
            return
        field = getattr(pynvml, _INSTANT_FIELD, None)
        if field is not None and self._instant_power(field) is not None:
            self._instant = field

    def _instant_power(self, field: int) -> Optional[float]:
        try:
            value = self._nvml.nvmlDeviceGetFieldValues(self._handle, [field])[0]
            return float(value.value.uiVal) / 1000.0 if value.nvmlReturn == 0 else None
        except Exception:  # noqa: BLE001 - an NVML without the field, or a failed read
            return None

    def _read(self) -> None:
        """One sample: the SM clock, the instant power where NVML has it, and a step of the counter."""
        nvml, handle = self._nvml, self._handle
        try:
            now = time.perf_counter()
            counter = float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            if counter != self._last_counter:
                self._steps.append((now, counter))
                self._last_counter = counter
            self._clocks.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        except Exception:  # noqa: BLE001 - a missed sample is not a failed measurement
            return
        if self._instant is not None:
            power = self._instant_power(self._instant)
            if power is not None:
                self._powers.append(power)

    def _sample(self) -> None:
        while not self._halt.is_set():
            self._read()
            self._halt.wait(self.sample_s)

    def start(self) -> None:
        """Read the energy counter and the host clock, start sampling (call after a device synchronize)."""
        self._start, self._window = None, None
        if not self.available:
            return
        try:
            self._last_counter = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001
            return
        self._clocks, self._powers, self._steps = [], [], []
        self._halt.clear()
        self._thread = threading.Thread(target=self._sample, name="tuner-energy", daemon=True)
        self._start = time.perf_counter()
        self._thread.start()

    def end(self) -> None:
        """Close the window now (call right after the device synchronize that ends the timed block): stop
        sampling and take the window's power. stop() computes the Energy later (it calls end() itself
        when the window is still open), so the host's work in between (reading the events) is not in it."""
        begun, self._start = self._start, None
        if begun is None:
            return
        self._stop_sampling()
        self._read()  # a step at the very end of the window counts
        self._window = (self._window_power(), time.perf_counter() - begun)

    def _window_power(self) -> Optional[float]:
        """The slope of the counter between its first and last step in the window; with fewer than
        MIN_STEPS steps, the mean instant power where NVML gives it, else None (too short to tell)."""
        if len(self._steps) >= MIN_STEPS:
            (t0, e0), (t1, e1) = self._steps[0], self._steps[-1]
            if t1 > t0 and e1 > e0:
                return (e1 - e0) / 1000.0 / (t1 - t0)
        return statistics.fmean(self._powers) if self._powers else None

    def stop(self, calls: int, median_us: float) -> Optional[Energy]:
        """The block's Energy (after a device synchronize); None when nothing could be measured.

        J per call = power x median call time. Not the counter delta / calls: the window also holds the
        L2-flush reads between repetitions (and the launch gaps), which that would charge to the kernel.
        Back to back at the power limit the board power is set by the limit whatever runs, so power x
        time is the kernel's share."""
        self.end()
        window, self._window = self._window, None
        if window is None or window[0] is None or calls <= 0:
            return None
        power, seconds = window
        clock = statistics.fmean(self._clocks) if self._clocks else None
        return Energy(power * median_us * 1e-6, power, clock, seconds * 1000.0)

    def _stop_sampling(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self._stop_sampling()
