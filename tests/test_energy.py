"""EnergyMeter driven by a fake pynvml whose energy counter moves in 100 ms steps, as a real one does: the
slope of its steps becomes power and J per call, clocks their mean; a window too short for the counter
gives the instant power or no energy (never a wrong one), and a missing or failing NVML gives no energy
and no error."""

from __future__ import annotations

import logging
import sys
import threading
import types

import pytest

from tuner.runtime import energy as energy_module
from tuner.runtime.energy import Energy, EnergyMeter, energy_of


class Clock:
    """time.perf_counter of the energy module, advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class Field:
    """One nvmlDeviceGetFieldValues result: value.uiVal in mW, nvmlReturn 0 (success)."""

    def __init__(self, milliwatts: float) -> None:
        self.nvmlReturn = 0
        self.value = types.SimpleNamespace(uiVal=int(milliwatts))


class FakeNvml(types.ModuleType):
    """The pynvml calls the meter makes: a card drawing `watts` on the fake host clock whose energy
    counter (mJ) moves in steps every `step_ms`, as a real one does (about every 100 ms); its SM clock
    cycling through `clocks`; an instant-power field reading `instant_w` (None: this NVML has none)."""

    NVML_CLOCK_SM = 1

    def __init__(self, clock: Clock, watts: float = 700.0, step_ms: int = 100, clocks=(1500.0,),
                 instant_w=None, fail_init=None) -> None:
        super().__init__("pynvml")
        self.clock, self.watts, self.step_ms, self.clocks = clock, watts, step_ms, list(clocks)
        self.instant_w, self.fail_init = instant_w, fail_init
        if instant_w is not None:
            self.NVML_FI_DEV_POWER_INSTANT = 186
        self.by_uuid: list[str] = []
        self.by_index: list[int] = []
        self.samples = 0
        self.reads = 0
        self.read = threading.Condition()

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.fail_init

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.by_uuid.append(uuid)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.by_index.append(index)
        return "handle"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> float:
        stepped_ms = round(self.clock.now * 1000) // self.step_ms * self.step_ms  # the last step's time
        with self.read:
            self.reads += 1
            self.read.notify_all()
        return 5_000_000.0 + self.watts * stepped_ms

    def nvmlDeviceGetClockInfo(self, handle: str, which: int) -> float:
        assert which == self.NVML_CLOCK_SM
        value = self.clocks[self.samples % len(self.clocks)]
        self.samples += 1
        return value

    def nvmlDeviceGetFieldValues(self, handle: str, fields: list) -> list:
        assert fields == [186] and self.instant_w is not None
        return [Field(self.instant_w * 1000.0)]

    def nvmlDeviceGetPowerUsage(self, handle: str) -> float:
        raise AssertionError("a one-second average is not a window's power")

    def wait_reads(self, n: int) -> bool:
        with self.read:
            return self.read.wait_for(lambda: self.reads >= n, timeout=5.0)


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(energy_module, "time", fake)
    return fake


def install(monkeypatch, nvml) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def run_window(meter: EnergyMeter, clock: Clock, nvml, seconds: float, tick: float = 0.01) -> None:
    """start(), then the fake clock advanced tick by tick, the sampling thread reading after each tick."""
    meter.start()
    for _ in range(round(seconds / tick)):
        clock.now += tick
        assert nvml.wait_reads(nvml.reads + 2)


def measure(meter: EnergyMeter, clock: Clock, nvml, seconds: float, calls: int, median_us: float):
    run_window(meter, clock, nvml, seconds)
    return meter.stop(calls, median_us)


def test_power_is_the_slope_of_the_counter_steps_and_j_per_call_power_times_the_median(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=700.0, clocks=(1500.0,))
    install(monkeypatch, nvml)
    meter = EnergyMeter(device=0, sample_s=0.0005)
    got = measure(meter, clock, nvml, 0.5, calls=1000, median_us=400.0)
    assert got is not None and meter.available and meter.why_not is None
    assert got.power_w == pytest.approx(700.0)
    # Not the energy / 1000 calls: the window holds the L2 flushes too; power x median call time.
    assert got.joules_per_call == pytest.approx(700.0 * 400e-6)
    assert got.sm_mhz == pytest.approx(1500.0) and got.window_ms == pytest.approx(500.0, abs=1.0)


def test_a_window_that_catches_one_step_more_reads_the_card_s_power_not_the_counter_delta(monkeypatch, clock):
    """The window opens just before a step and closes just after one: its counter delta holds 4 steps
    in 0.35 s (800 W at a 700 W card); the slope between the first and last step is the card's 700 W."""
    clock.now = 100.09
    nvml = FakeNvml(clock, watts=700.0)
    install(monkeypatch, nvml)
    got = measure(EnergyMeter(sample_s=0.0005), clock, nvml, 0.35, calls=100, median_us=1000.0)
    assert got is not None and got.power_w == pytest.approx(700.0)


def test_a_window_too_short_for_the_counter_has_no_energy_rather_than_a_wrong_one(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=700.0)  # no instant-power field
    install(monkeypatch, nvml)
    assert measure(EnergyMeter(sample_s=0.0005), clock, nvml, 0.1, calls=100, median_us=500.0) is None


def test_a_window_too_short_for_the_counter_takes_the_instant_power_where_nvml_has_it(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=700.0, instant_w=640.0)
    install(monkeypatch, nvml)
    got = measure(EnergyMeter(sample_s=0.0005), clock, nvml, 0.1, calls=100, median_us=500.0)
    assert got is not None and got.power_w == pytest.approx(640.0)
    assert got.joules_per_call == pytest.approx(640.0 * 500e-6)


def test_the_clock_is_the_mean_of_the_samples(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=500.0, clocks=(1300.0, 1700.0, 1800.0))
    install(monkeypatch, nvml)
    got = measure(EnergyMeter(sample_s=0.0005), clock, nvml, 0.5, calls=10, median_us=100.0)
    assert got is not None and 1300.0 < got.sm_mhz < 1800.0
    assert got.power_w == pytest.approx(500.0)


def test_a_metered_block_is_long_enough_for_several_counter_steps():
    assert energy_module.MIN_WINDOW_S * 1000 >= (energy_module.MIN_STEPS + 1) * 100  # steps ~100 ms apart
    assert EnergyMeter().min_window_s == energy_module.MIN_WINDOW_S


def fake_torch(monkeypatch, get_device_properties) -> None:
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=get_device_properties))
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_torch_devices_map_to_nvml_handles_by_uuid(monkeypatch, clock):
    nvml = FakeNvml(clock)
    install(monkeypatch, nvml)
    fake_torch(monkeypatch, lambda i: types.SimpleNamespace(uuid="abc-123"))
    assert EnergyMeter(device=1).available
    assert nvml.by_uuid == [b"GPU-abc-123"] and nvml.by_index == []


def test_without_a_uuid_the_torch_index_is_used(monkeypatch, clock):
    def no_cuda(i):
        raise RuntimeError("no CUDA")

    nvml = FakeNvml(clock)
    install(monkeypatch, nvml)
    fake_torch(monkeypatch, no_cuda)
    assert EnergyMeter(device=3).available and nvml.by_index == [3]


@pytest.mark.parametrize("broken", ["missing", "init fails", "no counter"])
def test_no_nvml_means_no_energy_and_no_error(monkeypatch, clock, caplog, broken):
    if broken == "missing":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    else:
        nvml = FakeNvml(clock, fail_init=RuntimeError("NVML Shared Library Not Found") if
                        broken == "init fails" else None)
        if broken == "no counter":
            def unsupported(handle):
                raise RuntimeError("Not Supported")
            nvml.nvmlDeviceGetTotalEnergyConsumption = unsupported
        install(monkeypatch, nvml)
    meter = EnergyMeter()
    with caplog.at_level(logging.WARNING, logger="tuner.runtime.energy"):
        meter.start()
        assert meter.stop(10, 100.0) is None
        meter.start()
        assert meter.stop(10, 100.0) is None
    assert not meter.available and meter.why_not
    assert len([r for r in caplog.records if "energy is not measured" in r.getMessage()]) == 1  # once


def test_stop_without_start_is_none(monkeypatch, clock):
    install(monkeypatch, FakeNvml(clock))
    assert EnergyMeter().stop(10, 100.0) is None


def test_stored_columns_make_an_energy_only_when_there_is_one():
    assert energy_of(None, None, None) is None and energy_of(0.1, None, 1500.0) is None
    assert energy_of(0.1, 700.0, None) == Energy(0.1, 700.0, None)
    assert Energy(0.1, 700.0, 1500.0).tflops_per_watt(350.0) == pytest.approx(0.5)
    assert Energy(0.1, 700.0, 1500.0).tflops_per_watt(None) is None


def test_the_window_closes_at_end_not_when_the_energy_is_computed(monkeypatch, clock):
    """time_cuda ends the window right after its synchronize, then reads its events: that host work is
    not in the window."""
    nvml = FakeNvml(clock, watts=700.0)
    install(monkeypatch, nvml)
    meter = EnergyMeter(sample_s=0.0005)
    run_window(meter, clock, nvml, 0.5)
    meter.end()
    clock.now += 5.0  # the card idles while the host reads the events (the counter goes on at 700 W here)
    got = meter.stop(100, 300.0)
    assert got is not None and got.window_ms == pytest.approx(500.0, abs=1.0) and got.power_w == pytest.approx(700.0)
    assert meter.stop(100, 300.0) is None  # one window, one Energy
