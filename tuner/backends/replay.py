"""A Backend that answers from a recorded results store instead of a GPU.

`tuner search --backend replay --from sqlite:///recording.db` runs the whole
search (Optuna, store, warm start, summary, resume, several workers) on a
machine without a GPU or nvcc: measure() returns what the recording measured
for the same problem, template and parameters, baselines() the recording's
baselines, and device_facts() the recording's card, so the new run says which
card its numbers came from.

A variant the recording never measured comes back as status `pruned` with the
reason NOT_RECORDED: the search stores it as such and tells Optuna "pruned",
which is neither a measurement nor a failure of the kernel.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from dataclasses import dataclass
from typing import Collection, Iterable, Optional, Sequence

from tuner.backends.base import BaselineMeasurement, ConfirmTimings, DeviceFacts, Measurement
from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import GpuProfile, list_profiles, load_profile
from tuner.runtime.build import BuiltKernel
from tuner.runtime.energy import median_energy
from tuner.runtime.objective import COLUMN, TIME, ConfirmRounds, figure
from tuner.runtime.timed import Timing
from tuner.runtime.timing import interleaved_timings
from tuner.status import TrialStatus
from tuner.store import RunInfo, TrialFilter, TrialRow, canonical_json, open_store, redact_url

NOT_RECORDED = "not measured in the recording"
REPLAYED_STATUSES = (TrialStatus.OK, TrialStatus.INCORRECT, TrialStatus.LAUNCH_ERROR, TrialStatus.TIMEOUT)
# Seconds each replayed measurement takes (default 0): lets tests and demos interrupt or kill a search
# mid-way, as they would a real one, and a search's own machinery be timed on a CPU as the GPU paces it
# (a submitted measurement is busy for that long while the search asks and stores, as a card would be).
DELAY_ENV = "TUNER_REPLAY_DELAY_S"


def recorded(r: TrialRow) -> Measurement:
    """What a recorded trial answers: its outcome and its stored Timing, as the GPU worker gave them."""
    return Measurement(r.status, r.timing, r.rel_error, r.error)


def _median_of(values: list[Optional[float]]) -> Optional[float]:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def _median_timing(samples: list[Timing]) -> Timing:
    """Each figure's median over the samples that have it (a baseline recorded in several runs)."""
    return Timing(statistics.median(t.median_us for t in samples), _median_of([t.p20_us for t in samples]),
                  _median_of([t.p80_us for t in samples]), None, median_energy([t.energy for t in samples]),
                  _median_of([t.isolated_us for t in samples]))


@dataclass
class _Paced:
    """A replayed measurement that is ready at `ready_at` (perf_counter time)."""

    measurement: Measurement
    ready_at: float
    seconds: float

    def result(self) -> Measurement:
        left = self.ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self.measurement


VariantKey = tuple[Problem, str, str]  # (problem, template, canonical JSON of the params)


def recorded_measurements(rows: Iterable[TrialRow]) -> dict[VariantKey, list[TrialRow]]:
    """Every replayable row of each variant, from rows in query_trials order (newest first).

    A recording may time a variant several times (benchmarks/record_grid.py does, to keep the
    noise of a real search): the backend draws one of them per measurement, as a GPU would give
    one of its spread of timings, and replay-eval takes their median as the variant's true time.
    """
    found: dict[VariantKey, list[TrialRow]] = {}
    for row in rows:
        if row.status in REPLAYED_STATUSES:
            found.setdefault((row.problem, row.template, canonical_json(row.params)), []).append(row)
    return found


class ReplayBackend:
    """Measurements looked up in another results store (read once, at construction).

    A variant (or baseline) recorded several times answers each measurement, and each confirm
    round, with one of its recorded timings drawn at random (seeded); one recorded once always
    answers the same.

    With an `objective` other than time, only recorded ok timings that have its figure (energy, the
    isolated µs) answer: the others were not measured for it. A recording with none is refused."""

    needs_compile = False

    def __init__(self, url: str, profile: Optional[GpuProfile] = None, *, force: bool = False,
                 delay_s: Optional[float] = None, seed: Optional[int] = None, objective: str = TIME) -> None:
        self._problem_of: dict[int, Problem] = {}
        self._rng = random.Random(seed)
        self._objective = objective  # which confirm rounds carry energy (objective.metered), as on the GPU
        with open_store(url, create=False) as source:
            # Measured runs only: a replay's own answers in that store would count its recording twice (or another
            # recording's numbers under this one's name).
            rows = [r for r in source.query_trials(TrialFilter()) if r.replayed_from is None]
            self._facts, self._run_ids = self._pick_gpu(source.url, rows, profile, force)
            self._trials: dict[tuple, list[Measurement]] = {}
            self._baselines: dict[Problem, dict[str, list[BaselineMeasurement]]] = {}
            mine = [row for row in rows if row.run_id in self._run_ids]
            baseline_keys = {(row.run_id, row.problem_id) for row in mine}
            for key, found in recorded_measurements(mine).items():
                kept = [recorded(r) for r in found if r.status is not TrialStatus.OK or figure(objective, r) is not None]
                if kept:
                    self._trials[key] = kept
            for row in mine:
                if row.status in REPLAYED_STATUSES:
                    self._problem_of[row.problem_id] = row.problem
            for run_id, problem_id in sorted(baseline_keys, reverse=True):
                problem = self._problem_of.get(problem_id)
                if problem is None:
                    continue
                for b in source.baselines_for(run_id, problem_id):
                    self._baselines.setdefault(problem, {}).setdefault(b.impl, []).append(
                        BaselineMeasurement(b.impl, b.timing))
        self.source_url = source.url
        if objective != TIME and not any(r.status is TrialStatus.OK for rows in self._trials.values() for r in rows):
            raise TunerError(_lacking(objective, source.url))
        self._delay = float(os.environ.get(DELAY_ENV, "0") or 0) if delay_s is None else delay_s

    def _pick_gpu(self, where: str, rows: list[TrialRow], profile: Optional[GpuProfile],
                  force: bool) -> tuple[DeviceFacts, set[int]]:
        """The recorded GPU to replay: the one the profile matches (or the only one)."""
        gpus: dict[str, set[int]] = {}
        for row in rows:
            gpus.setdefault(row.gpu_name, set()).add(row.run_id)
        if not gpus:
            raise TunerError(f"the recording at {where} holds no trials measured on a GPU (a replay's are not)")
        names = sorted(gpus)
        chosen = [n for n in names if profile is not None and profile.matches(n)]
        if not chosen:
            if profile is not None and not force:
                raise TunerError(
                    f"the recording at {where} has no trials from a {profile.display_name} "
                    f"(it has: {', '.join(names)}); pick the matching --gpu, or --force"
                )
            chosen = names
        if len(chosen) > 1:
            raise TunerError(f"the recording at {where} holds several GPUs ({', '.join(chosen)}); name one with --gpu")
        gpu_name = chosen[0]
        return DeviceFacts(gpu_name=gpu_name), gpus[gpu_name]

    # --- Backend protocol ---------------------------------------------------------------------

    def device_facts(self) -> DeviceFacts:
        return self._facts

    def baselines(self, problem: Problem) -> list[BaselineMeasurement]:
        """Each baseline's median over its recorded timings (one per recorded run)."""
        out = [samples[0] if len(samples) == 1 else BaselineMeasurement(impl, _median_timing([b.timing for b in samples]))
               for impl, samples in self._baselines.get(problem, {}).items()]
        return sorted(out, key=lambda b: b.timing.median_us)

    def submit_measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                       range_prefix: str = "") -> "_Paced":
        """Answered at once, ready after the delay: the search's work meanwhile overlaps it, as with a GPU."""
        return _Paced(self._lookup(problem, variant), time.perf_counter() + self._delay, self._delay)

    def measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                range_prefix: str = "") -> Measurement:
        if self._delay:
            time.sleep(self._delay)
        return self._lookup(problem, variant)

    def _lookup(self, problem: Problem, variant: Variant) -> Measurement:
        samples = self._trials.get((problem, variant.template, canonical_json(variant.stored_params())))
        if not samples:
            return Measurement(status=TrialStatus.PRUNED, error=NOT_RECORDED)
        return self._rng.choice(samples)

    def confirm(self, problem: Problem, variants: list[Variant], builts: list[Optional[BuiltKernel]],
                rounds: int, *, baselines: Optional[Collection[str]] = None, first_round: int = 0,
                energy_pass: bool = False) -> ConfirmTimings:
        """The GPU worker's interleaved rounds, each timing one draw from the recorded timings of the
        variant or baseline (with one recorded timing, always that); each draw takes the delay."""
        samples: dict[str, list[Timing]] = {}
        for variant in variants:
            rows = self._trials.get((problem, variant.template, canonical_json(variant.stored_params())), [])
            ok = [r.timing for r in rows if r.status is TrialStatus.OK and r.timing is not None]
            if ok:
                samples[variant.name] = ok
        for impl, measured in self._baselines.get(problem, {}).items():
            if baselines is None or impl in baselines:
                samples[impl] = [m.timing for m in measured]

        race = ConfirmRounds(self._objective, first_round, rounds, energy_pass)

        def draw(impl: str) -> Timing:
            if self._delay:
                time.sleep(self._delay)
            timing = self._rng.choice(samples[impl])
            if race.metered:
                return timing
            return dataclasses.replace(timing, energy=None)  # as the GPU worker: no meter in this round

        calls = {impl: (lambda impl=impl: draw(impl)) for impl in samples}
        return ConfirmTimings.of(interleaved_timings(calls, rounds, race.start, first_round=first_round))

    def close(self) -> None:
        pass


def _lacking(objective: str, where: str) -> str:
    return (f"--objective {objective}: the recording at {where} holds no trial with {COLUMN[objective]} "
            f"(it was recorded without it); replay it with --objective time")


def check_recording_objective(url: str, objective: str) -> None:
    """A one-line TunerError when the recording holds no ok trial with the objective's figure (checked
    before a search prepares its studies; the backend checks again on its own rows)."""
    if objective == TIME:
        return
    with open_store(url, create=False) as source:
        rows = source.query_trials(TrialFilter(status=TrialStatus.OK))
        where = source.url
    if not any(figure(objective, r) is not None for r in rows):
        raise TunerError(_lacking(objective, where))


def recorded_problems(url: str, profile: GpuProfile, force: bool = False) -> list[Problem]:
    """The problems the recording holds replayable trials of, measured on the card the profile matches
    (with `force` and no such card, on any card), as ReplayBackend picks them."""
    with open_store(url, create=False) as source:
        rows = [r for r in source.query_trials(TrialFilter()) if r.replayed_from is None and r.status in REPLAYED_STATUSES]
    mine = [r for r in rows if profile.matches(r.gpu_name)]
    if not mine and force:
        mine = rows
    return list(dict.fromkeys(r.problem for r in mine))


def check_recorded(url: str, profile: GpuProfile, wanted: Sequence[Problem], recorded: Sequence[Problem]) -> None:
    """A one-line TunerError naming the first of `wanted` the recording does not hold, and what it holds
    (checked before anything is written: a replay of it would only prune every point)."""
    missing = [p for p in wanted if p not in set(recorded)]
    if not missing:
        return
    has = ", ".join(p.label for p in recorded) or f"no trials measured on a {profile.display_name}"
    raise TunerError(f"the recording at {redact_url(url)} has no trials of {missing[0].label} measured on "
                     f"{profile.display_name} (it has: {has}); replay one of those with --shape")


def recording_profile(url: str) -> GpuProfile:
    """The GPU profile of a recording's card (for --gpu auto with --backend replay)."""
    with open_store(url, create=False) as source:
        rows = source.query_trials(TrialFilter(limit=1))
        where = source.url
    if not rows:
        raise TunerError(f"the recording at {where} holds no trials")
    row = rows[0]
    try:
        return load_profile(row.profile)
    except TunerError:
        matching = [p for p in list_profiles() if p.matches(row.gpu_name)]
        if len(matching) != 1:
            raise TunerError(f"no single GPU profile matches the recording's {row.gpu_name!r}; name one with --gpu") from None
        return matching[0]


SYNTHETIC_HOST = "synthetic"  # the host of a synthetic recording's run: its numbers are not measurements


def is_synthetic_run(run: Optional[RunInfo]) -> bool:
    """Whether a run is a synthetic recording (see synthetic_run_info)."""
    return run is not None and run.host == SYNTHETIC_HOST


def synthetic_run_info(gpu_name: str = "NVIDIA H100 80GB HBM3", profile: str = "h100") -> RunInfo:
    """RunInfo of a synthetic recording (tests, demos): says so in its host and command line."""
    return RunInfo(gpu_name=gpu_name, profile=profile, host=SYNTHETIC_HOST, command_line="synthetic recording (not measured)")
