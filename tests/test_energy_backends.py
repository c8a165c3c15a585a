"""Energy from the backends: one typed Energy through the GPU worker's pipe, replayed from a recording
that has it, made up by the synthetic recording; --objective energy refused where there is none."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_gpu_worker import PROBLEM, FakeRunner, fake_built

from tuner.backends.gpu import GpuBackend
from tuner.backends.gpu_child import CudaRunner, RunnerOptions
from tuner.backends.replay import ReplayBackend
from tuner.backends.synthetic import write_synthetic_recording
from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.energy import Energy
from tuner.runtime.timing import Timing
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

E = Energy(0.007, 690.0, 1555.0, 102.0)


class EnergyRunner(FakeRunner):
    """Replies as CudaRunner does: an Energy with each timing, isolated µs under --objective isolated."""

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "gpu_name": f"Fake GPU ({self.options.objective})"}

    def _isolated(self) -> float | None:
        return 8.0 if self.options.objective == "isolated" else None

    def _figures(self, timing: Timing) -> Timing:
        return replace(timing, energy=E, isolated_us=self._isolated())

    def baselines(self, problem: Problem, range_prefix: str, progress) -> list[dict[str, Any]]:
        return [{**row, "timing": self._figures(row["timing"])}
                for row in super().baselines(problem, range_prefix, progress)]

    def measure(self, request: dict[str, Any], progress) -> dict[str, Any]:
        reply = super().measure(request, progress)
        return {**reply, "timing": self._figures(reply["timing"])}

    def confirm(self, request: dict[str, Any], progress) -> dict[str, list[Timing]]:
        names = [b.entry for b in request["builts"]] + ["sdpa_flash"]
        return {name: [Timing(10.0 + r, 10.0, 10.0, 5, E if r else None, self._isolated())
                       for r in range(request["rounds"])] for name in names}


class RefusingRunner(FakeRunner):
    def setup(self) -> None:
        raise TunerError("--objective energy needs NVML's energy counter on GPU 0, which this machine does not "
                         "give (ImportError: No module named 'pynvml')")


@pytest.fixture
def profile():
    return load_profile("h100")


def backend_of(profile, runner, objective: str = "time") -> GpuBackend:
    return GpuBackend(profile, watchdog_s=1.0, runner=runner, timing_budget_s=5.0, start_timeout_s=120,
                      objective=objective)


def test_the_gpu_worker_sends_one_energy_with_each_timing(profile) -> None:
    with backend_of(profile, EnergyRunner) as backend:
        assert backend.device_facts().gpu_name == "Fake GPU (time)"  # the objective reached the child
        [b] = backend.baselines(PROBLEM)
        m = backend.measure_request({"problem": PROBLEM, "built": fake_built("ok"), "range_prefix": "r"})
        timings = backend.confirm(PROBLEM, [], [fake_built("ok")], 2)
    assert (b.energy, b.isolated_us) == (E, None) and (m.energy, m.isolated_us) == (E, None)
    assert m.status is TrialStatus.OK
    assert timings.rounds == {"ok": (10.0, 11.0), "sdpa_flash": (10.0, 11.0)}
    assert timings.energy == {"ok": (None, E), "sdpa_flash": (None, E)} and timings.isolated_us == {}


def test_the_isolated_objective_brings_isolated_times_too(profile) -> None:
    with backend_of(profile, EnergyRunner, "isolated") as backend:
        [b] = backend.baselines(PROBLEM)
        m = backend.measure_request({"problem": PROBLEM, "built": fake_built("ok"), "range_prefix": "r"})
        timings = backend.confirm(PROBLEM, [], [fake_built("ok")], 1)
    assert b.isolated_us == 8.0 and m.isolated_us == 8.0 and timings.isolated_us == {"ok": (8.0,), "sdpa_flash": (8.0,)}


def test_a_setup_refusal_reaches_the_user_as_its_one_line(profile) -> None:
    with backend_of(profile, RefusingRunner, "energy") as backend:
        with pytest.raises(TunerError) as info:
            backend.device_facts()
    assert str(info.value).startswith("--objective energy needs NVML") and "\n" not in str(info.value)


class NoMeter:
    available = False
    why_not = "ImportError: No module named 'pynvml'"


@pytest.mark.parametrize("objective", ["time", "energy", "isolated"])
def test_the_cuda_runner_refuses_the_energy_objective_at_setup_without_nvml(monkeypatch, objective) -> None:
    from tuner.backends import gpu_child

    monkeypatch.setattr(gpu_child, "cuda_driver", lambda device: None)
    runner = CudaRunner(RunnerOptions(objective=objective))
    runner._meter = NoMeter()  # type: ignore[assignment]
    if objective != "energy":
        runner.setup()  # no energy is no error: measurements carry None
        return
    with pytest.raises(TunerError, match=r"^--objective energy needs NVML's energy counter on GPU 0, .*pynvml"):
        runner.setup()


# --- synthetic and replayed recordings ------------------------------------------------------------

SMALL = Problem(1, 8, 512, 512, 64)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("energy-recordings")
    urls = {kind: f"sqlite:///{folder / kind}.db" for kind in ("energy", "none", "isolated")}
    write_synthetic_recording(urls["energy"], [SMALL])
    write_synthetic_recording(urls["none"], [SMALL], energy=False)
    write_synthetic_recording(urls["isolated"], [SMALL], isolated=True)
    return urls


def test_a_synthetic_recording_has_energy_unless_told_otherwise(recordings) -> None:
    with open_store(recordings["energy"], create=False) as store:
        rows = [r for r in store.query_trials(TrialFilter(status=TrialStatus.OK))]
        baselines = store.baselines_for(rows[0].run_id, rows[0].problem_id)
    assert rows and all(r.energy is not None and r.isolated_us is None for r in rows)
    assert all(r.energy.joules_per_call == pytest.approx(r.energy.power_w * r.median_us * 1e-6) for r in rows)
    assert len({round(r.energy.power_w, 3) for r in rows}) > 1  # variants draw different powers
    assert baselines and all(b.energy is not None for b in baselines)
    with open_store(recordings["none"], create=False) as store:
        assert all(r.energy is None for r in store.query_trials(TrialFilter()))


def _ok_variant(url: str) -> Variant:
    with open_store(url, create=False) as store:
        row = store.query_trials(TrialFilter(status=TrialStatus.OK, limit=1))[0]
    return Variant.from_stored(row.template, row.params), row


def test_replay_carries_the_recorded_energy(recordings) -> None:
    variant, row = _ok_variant(recordings["energy"])
    backend = ReplayBackend(recordings["energy"], load_profile("h100"), objective="energy")
    m = backend.measure(SMALL, variant, None)
    assert (m.median_us, m.energy) == (row.median_us, row.energy)
    assert all(b.energy is not None for b in backend.baselines(SMALL))
    timings = backend.confirm(SMALL, [variant], [None], 2)
    assert timings.energy[variant.name] == (row.energy, row.energy)


def test_replay_of_a_recording_without_energy_gives_none_and_refuses_the_energy_objective(recordings) -> None:
    variant, _ = _ok_variant(recordings["none"])
    backend = ReplayBackend(recordings["none"], load_profile("h100"))
    assert backend.measure(SMALL, variant, None).energy is None
    assert all(b.energy is None for b in backend.baselines(SMALL))
    for objective, column in (("energy", "joules_per_call"), ("isolated", "isolated_us")):
        with pytest.raises(TunerError) as info:
            ReplayBackend(recordings["none"], load_profile("h100"), objective=objective)
        assert f"--objective {objective}: the recording" in str(info.value) and column in str(info.value)
        assert "\n" not in str(info.value)


def test_replay_for_the_isolated_objective_answers_with_the_isolated_times(recordings) -> None:
    variant, row = _ok_variant(recordings["isolated"])
    backend = ReplayBackend(recordings["isolated"], load_profile("h100"), objective="isolated")
    m = backend.measure(SMALL, variant, None)
    assert m.isolated_us == row.isolated_us and m.isolated_us < m.median_us
    assert backend.confirm(SMALL, [variant], [None], 1).isolated_us[variant.name] == (row.isolated_us,)
