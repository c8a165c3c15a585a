"""Energy where it decides: the GPU worker's CudaRunner reads the energy meter (a 0.5 s block at least) for
the confirm stage's energy pass (its winner and that one's baseline, after the race), and for a search's trials,
baselines and every confirm round only under --objective energy. Run on a CPU: the inputs, the kernel and the timing are stand-ins that record what
the runner asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from tuner.backends import gpu_child
from tuner.backends.gpu_child import CudaRunner, RunnerOptions
from tuner.problem import Problem
from tuner.runtime.objective import ENERGY, ISOLATED, TIME
from tuner.runtime.timed import Timing

PROBLEM = Problem(1, 2, 128, 128, 64)
METER = object()  # the runner's EnergyMeter, as the timing calls receive it
TIMING = Timing(10.0, 9.5, 10.5, 200)


@dataclass
class Asked:
    """What each timing was asked for, in order: (who, meter, isolated_too)."""

    calls: list[tuple[str, Any, bool]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # (warmup_ms, rep_ms) of each

    def timing(self, who: str, kwargs: dict[str, Any]) -> Timing:
        self.calls.append((who, kwargs.get("meter"), bool(kwargs.get("isolated_too"))))
        self.windows.append((kwargs["warmup_ms"], kwargs["rep_ms"]))
        return TIMING


class FakeBaseline:
    def __init__(self, name: str, asked: Asked) -> None:
        self.name, self._asked = name, asked

    def time(self, **kwargs: Any) -> Timing:
        return self._asked.timing(self.name, kwargs)


class FakeKernel:
    registers = 96


@dataclass
class FakeBuilt:
    entry: str = "kernel_a"

    @property
    def compiled(self) -> Any:
        return type("Compiled", (), {"cubin": b"cubin"})()

    def load(self, device: int, cubin: bytes = b"") -> FakeKernel:
        return FakeKernel()


class ExactReference:
    def error(self, out: Any) -> float:
        return 0.0


@pytest.fixture
def runner_of(monkeypatch) -> Callable[[str], tuple[CudaRunner, Asked]]:
    import torch

    asked = Asked()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(gpu_child, "time_call", lambda fn, **kwargs: asked.timing("kernel", kwargs))
    monkeypatch.setattr(gpu_child, "kernel_call", lambda kernel, data, out, checked: (lambda: None))
    monkeypatch.setattr(gpu_child, "trial_output", lambda problem, data: object())
    monkeypatch.setattr(gpu_child, "available_baselines",
                        lambda *args, **kwargs: [FakeBaseline("sdpa_flash", asked), FakeBaseline("sdpa_cudnn", asked)])

    def make(objective: str) -> tuple[CudaRunner, Asked]:
        runner = CudaRunner(RunnerOptions(objective=objective))
        runner._meter = METER  # type: ignore[assignment]
        data = {"q": None, "k": None, "v": None, "scale": 0.125, "seed": 1, "ref": ExactReference()}
        monkeypatch.setattr(runner, "_problem_inputs", lambda problem: data)
        # The stand-in inputs are never written to: as built (for a runner that checks them after each launch).
        monkeypatch.setattr(runner, "_intact", lambda problem, data: True, raising=False)
        return runner, asked

    return make


def noop(*_args: Any, **_kwargs: Any) -> None:
    pass


def measure(runner: CudaRunner) -> dict[str, Any]:
    return runner.measure({"problem": PROBLEM, "built": FakeBuilt(), "range_prefix": "r/t1"}, noop)


def confirm(runner: CudaRunner, rounds: int = 2, **race: Any) -> dict[str, list[Timing]]:
    return runner.confirm({"problem": PROBLEM, "builts": [FakeBuilt()], "rounds": rounds, "baselines": None, **race},
                          noop)


def test_a_trial_of_the_default_objective_is_timed_without_the_meter_and_its_confirm_stage_with_it(runner_of):
    runner, asked = runner_of(TIME)
    reply = measure(runner)
    assert reply["status"] == "ok" and reply["timing"] == TIMING  # the Timing whole, as the pipe carries it
    runner.baselines(PROBLEM, "r", noop)
    assert asked.calls == [("kernel", None, False), ("sdpa_flash", None, False), ("sdpa_cudnn", None, False)]
    asked.calls.clear()
    timed = confirm(runner)
    assert set(timed) == {"kernel_a", "sdpa_flash", "sdpa_cudnn"} and all(len(t) == 2 for t in timed.values())
    # the race's rounds decide on µs: none reads the meter (before, its last round did, for every implementation)
    assert len(asked.calls) == 6 and all(meter is None for _, meter, _ in asked.calls)


def test_a_confirm_race_reads_the_meter_in_its_energy_pass_alone(runner_of):
    runner, asked = runner_of(TIME)
    for number in range(7):  # as the confirm stage asks: one round a request
        confirm(runner, rounds=1, first_round=number)
    assert len(asked.calls) == 21 and all(meter is None for _, meter, _ in asked.calls)
    asked.calls.clear()
    # the energy pass: the winner and the one baseline asked for, one metered block each
    timed = runner.confirm({"problem": PROBLEM, "builts": [FakeBuilt()], "rounds": 1, "baselines": ["sdpa_cudnn"],
                            "first_round": 7, "energy_pass": True}, noop)
    assert set(timed) == {"kernel_a", "sdpa_cudnn"}
    assert len(asked.calls) == 2 and all(meter is METER for _, meter, _ in asked.calls)


def test_under_the_energy_objective_every_trial_and_baseline_reads_the_meter(runner_of):
    runner, asked = runner_of(ENERGY)
    measure(runner)
    measure(runner)
    runner.baselines(PROBLEM, "r", noop)
    confirm(runner, rounds=1, first_round=0)
    assert len(asked.calls) == 7 and all(meter is METER for _, meter, _ in asked.calls)


def test_the_isolated_objective_times_isolated_calls_but_meters_only_the_confirm_stage(runner_of):
    runner, asked = runner_of(ISOLATED)
    measure(runner)
    confirm(runner, rounds=2)
    confirm(runner, rounds=1, first_round=2, energy_pass=True)
    assert asked.calls[0] == ("kernel", None, True)
    assert all(isolated for _, _, isolated in asked.calls[1:])
    assert [meter is METER for _, meter, _ in asked.calls[1:]] == [False] * 6 + [True] * 3


def test_a_search_times_its_trials_and_baselines_over_half_the_confirm_stages_window(runner_of):
    """A search's figures only rank variants for the confirm stage (issue 38: the window was most of a trial's
    0.14 s); its trials and the baselines they are set beside share one window, so their ratios compare like
    with like; the confirm rounds, whose ratios are reported, keep time_cuda's full window."""
    runner, asked = runner_of(TIME)
    measure(runner)
    runner.baselines(PROBLEM, "r", noop)
    confirm(runner, rounds=1)
    trial, first_baseline, second_baseline, *confirmed = asked.windows
    assert trial == first_baseline == second_baseline
    assert len(confirmed) == 3 and all(w == confirmed[0] for w in confirmed)  # the kernel and both baselines
    assert trial[0] < confirmed[0][0] and trial[1] * 2 <= confirmed[0][1]


def test_a_problems_baselines_are_made_once_for_its_inputs_and_reused_by_each_confirm_round(runner_of, monkeypatch):
    """Each baseline's first call (FA4's compile, cuDNN's plan) is made once per problem's inputs: the baselines
    request and every confirm round (one request each) reuse them (before, each request made them again)."""
    runner, asked = runner_of(TIME)
    made: list[int] = []
    monkeypatch.setattr(gpu_child, "available_baselines",
                        lambda *a, **k: made.append(1) or [FakeBaseline("sdpa_flash", asked)])
    runner.baselines(PROBLEM, "r", noop)
    for number in range(3):
        confirm(runner, rounds=1, first_round=number)
    assert len(made) == 1
    fresh = {"q": None, "k": None, "v": None, "scale": 0.125, "seed": 2, "ref": ExactReference()}
    monkeypatch.setattr(runner, "_problem_inputs", lambda problem: fresh)  # rebuilt inputs (a new seed)
    confirm(runner, rounds=1, first_round=3)
    assert len(made) == 2
    assert "baseline set-up" in runner.spent.take()
