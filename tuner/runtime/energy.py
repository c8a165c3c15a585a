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
`meter.why_not`): a measurement without energy is still a measurement.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger(__name__)
SAMPLE_S = 0.005  # the sampling thread's period (SM clock and power)


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
    """Energy, SM clock and power of one device over a timed block (start() ... stop()).

    NVML (package nvidia-ml-py, module pynvml) is opened lazily, on the first use, in the process that
    times (the GPU worker). Where it is missing or fails, `available` is False, `why_not` says why
    (logged once), and stop() returns None."""

    def __init__(self, device: int = 0, sample_s: float = SAMPLE_S) -> None:
        self.device, self.sample_s = device, sample_s
        self.why_not: Optional[str] = None
        self._nvml: Any = None
        self._handle: Any = None
        self._opened = False
        self._thread: Optional[threading.Thread] = None
        self._halt = threading.Event()
        self._clocks: list[float] = []
        self._powers: list[float] = []
        self._start: Optional[tuple[float, float]] = None  # (counter mJ, host seconds)
        self._window: Optional[tuple[Optional[float], float]] = None  # (joules, seconds) of the closed window

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

    def _read(self) -> None:
        """One sample of the SM clock and the power draw."""
        nvml, handle = self._nvml, self._handle
        try:
            self._clocks.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
            self._powers.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        except Exception:  # noqa: BLE001 - a missed sample is not a failed measurement
            pass

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
            counter = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001
            return
        self._clocks, self._powers = [], []
        self._halt.clear()
        self._thread = threading.Thread(target=self._sample, name="tuner-energy", daemon=True)
        self._start = (counter, time.perf_counter())
        self._thread.start()

    def end(self) -> None:
        """Close the window now (call right after the device synchronize that ends the timed block): read the
        counter and the host clock, stop sampling. stop() computes the Energy later (it calls end() itself
        when the window is still open), so the host's work in between (reading the events) is not in it."""
        begun, self._start = self._start, None
        if begun is None:
            return
        seconds = time.perf_counter() - begun[1]
        try:
            counter: Optional[float] = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001
            counter = None
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self._clocks:  # a window shorter than one sampling period
            self._read()
        self._window = (None if counter is None else (counter - begun[0]) / 1000.0, seconds)

    def stop(self, calls: int, median_us: float) -> Optional[Energy]:
        """The block's Energy (after a device synchronize); None when nothing was read.

        power = energy-counter delta / wall window, and J per call = power x median call time. Not the
        counter delta / calls: the window also holds the L2-flush reads between repetitions (and the
        launch gaps), which that would charge to the kernel. Back to back at the power limit the board
        power is set by the limit whatever runs, so power x time is the kernel's share."""
        self.end()
        window, self._window = self._window, None
        if window is None or calls <= 0:
            return None
        joules, seconds = window
        if joules is not None and joules > 0 and seconds > 0:
            power = joules / seconds
        elif self._powers:  # the counter did not move in a short window: the sampled power instead
            power = statistics.fmean(self._powers)
        else:
            return None
        clock = statistics.fmean(self._clocks) if self._clocks else None
        return Energy(power * median_us * 1e-6, power, clock, seconds * 1000.0)

    def close(self) -> None:
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None
