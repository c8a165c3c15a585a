"""EnergyMeter driven by a fake pynvml: counter deltas become power and J per call, clocks their mean,
and a missing or failing NVML gives no energy and no error."""

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


class FakeNvml(types.ModuleType):
    """The few pynvml calls the meter makes: a card drawing `watts` on the fake host clock (its energy
    counter, in mJ, grows with it), its SM clock and power samples cycling through the values given."""

    NVML_CLOCK_SM = 1

    def __init__(self, clock: Clock, watts: float = 700.0, clocks=(1500.0,), powers_mw=(650_000.0,),
                 fail_init=None) -> None:
        super().__init__("pynvml")
        self.clock, self.watts, self.clocks, self.powers = clock, watts, list(clocks), list(powers_mw)
        self.fail_init = fail_init
        self.sampled = threading.Event()
        self.by_uuid: list[str] = []
        self.by_index: list[int] = []
        self.samples = 0

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
        return 5_000_000.0 + self.watts * self.clock.now * 1000.0

    def nvmlDeviceGetClockInfo(self, handle: str, which: int) -> float:
        assert which == self.NVML_CLOCK_SM
        value = self.clocks[self.samples % len(self.clocks)]
        self.samples += 1
        if self.samples >= 4:
            self.sampled.set()
        return value

    def nvmlDeviceGetPowerUsage(self, handle: str) -> float:
        return self.powers[(self.samples - 1) % len(self.powers)]


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(energy_module, "time", fake)
    return fake


def install(monkeypatch, nvml) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def measure(meter: EnergyMeter, clock: Clock, seconds: float, calls: int, median_us: float, nvml=None):
    meter.start()
    if nvml is not None:
        assert nvml.sampled.wait(5.0)  # the sampling thread ran a few times
    clock.now += seconds
    return meter.stop(calls, median_us)


def test_power_is_the_counter_delta_over_the_window_and_j_per_call_power_times_the_median(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=700.0, clocks=(1500.0,))  # 70 J in 0.1 s
    install(monkeypatch, nvml)
    meter = EnergyMeter(device=0, sample_s=0.0005)
    got = measure(meter, clock, 0.1, calls=200, median_us=400.0, nvml=nvml)
    assert got is not None and meter.available and meter.why_not is None
    assert got.power_w == pytest.approx(700.0)
    # Not 70 J / 200 calls (0.35 J): the window holds the L2 flushes too; power x median call time.
    assert got.joules_per_call == pytest.approx(700.0 * 400e-6)
    assert got.sm_mhz == pytest.approx(1500.0) and got.window_ms == pytest.approx(100.0)


def test_the_clock_is_the_mean_of_the_samples(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=500.0, clocks=(1300.0, 1700.0, 1800.0))
    install(monkeypatch, nvml)
    got = measure(EnergyMeter(sample_s=0.0005), clock, 0.1, calls=10, median_us=100.0, nvml=nvml)
    assert got is not None and 1300.0 < got.sm_mhz < 1800.0
    assert got.power_w == pytest.approx(500.0)


def test_a_counter_that_did_not_move_falls_back_on_the_sampled_power(monkeypatch, clock):
    nvml = FakeNvml(clock, watts=0.0, powers_mw=(650_000.0,))  # the counter stands still
    install(monkeypatch, nvml)
    got = measure(EnergyMeter(sample_s=0.0005), clock, 0.002, calls=10, median_us=100.0, nvml=nvml)
    assert got is not None and got.power_w == pytest.approx(650.0)
    assert got.joules_per_call == pytest.approx(650.0 * 100e-6)


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
    meter.start()
    assert nvml.sampled.wait(5.0)
    clock.now += 0.1
    meter.end()
    clock.now += 5.0  # the card idles while the host reads the events (the counter goes on at 700 W here)
    got = meter.stop(100, 300.0)
    assert got is not None and got.window_ms == pytest.approx(100.0) and got.power_w == pytest.approx(700.0)
    assert meter.stop(100, 300.0) is None  # one window, one Energy
