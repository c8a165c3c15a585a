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

import os
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from tuner.backends.base import BaselineMeasurement, ConfirmTimings, DeviceFacts, Measurement
from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import GpuProfile, list_profiles, load_profile
from tuner.runtime.build import BuiltKernel
from tuner.status import TrialStatus
from tuner.store import RunInfo, TrialFilter, TrialRow, canonical_json, open_store

NOT_RECORDED = "not measured in the recording"
REPLAYED_STATUSES = (TrialStatus.OK, TrialStatus.INCORRECT, TrialStatus.LAUNCH_ERROR, TrialStatus.TIMEOUT)
# Seconds each replayed measurement sleeps (default 0): lets tests and demos
# interrupt or kill a search mid-way, as they would a real one.
DELAY_ENV = "TUNER_REPLAY_DELAY_S"


@dataclass(frozen=True)
class _Recorded:
    status: TrialStatus
    median_us: Optional[float]
    p20_us: Optional[float]
    p80_us: Optional[float]
    rel_error: Optional[float]
    error: Optional[str]


VariantKey = tuple[Problem, str, str]  # (problem, template, canonical JSON of the params)


def newest_measurements(rows: Iterable[TrialRow]) -> dict[VariantKey, TrialRow]:
    """The newest replayable row of each variant, from rows in query_trials order (newest first).

    A variant measured twice replays as its last measurement (the backend and replay-eval agree on this).
    """
    newest: dict[VariantKey, TrialRow] = {}
    for row in rows:
        if row.status in REPLAYED_STATUSES:
            newest.setdefault((row.problem, row.template, canonical_json(row.params)), row)
    return newest


class ReplayBackend:
    """Measurements looked up in another results store (read once, at construction)."""

    needs_compile = False

    def __init__(self, url: str, profile: Optional[GpuProfile] = None, *, force: bool = False,
                 delay_s: Optional[float] = None) -> None:
        self._problem_of: dict[int, Problem] = {}
        with open_store(url, create=False) as source:
            rows = source.query_trials(TrialFilter())
            self._facts, self._run_ids = self._pick_gpu(source.url, rows, profile, force)
            self._trials: dict[tuple, _Recorded] = {}
            self._baselines: dict[Problem, dict[str, BaselineMeasurement]] = {}
            mine = [row for row in rows if row.run_id in self._run_ids]
            baseline_keys = {(row.run_id, row.problem_id) for row in mine}
            for key, row in newest_measurements(mine).items():
                self._trials[key] = _Recorded(row.status, row.median_us, row.p20_us, row.p80_us, row.rel_error,
                                              row.error)
            for row in mine:
                if row.status in REPLAYED_STATUSES:
                    self._problem_of[row.problem_id] = row.problem
            for run_id, problem_id in sorted(baseline_keys, reverse=True):
                problem = self._problem_of.get(problem_id)
                if problem is None:
                    continue
                for b in source.baselines_for(run_id, problem_id):
                    self._baselines.setdefault(problem, {}).setdefault(
                        b.impl, BaselineMeasurement(b.impl, b.median_us, b.p20_us or b.median_us, b.p80_us or b.median_us)
                    )
        self.source_url = source.url
        self._delay = float(os.environ.get(DELAY_ENV, "0") or 0) if delay_s is None else delay_s

    def _pick_gpu(self, where: str, rows: list[TrialRow], profile: Optional[GpuProfile],
                  force: bool) -> tuple[DeviceFacts, set[int]]:
        """The recorded GPU to replay: the one the profile matches (or the only one)."""
        gpus: dict[str, set[int]] = {}
        for row in rows:
            gpus.setdefault(row.gpu_name, set()).add(row.run_id)
        if not gpus:
            raise TunerError(f"the recording at {where} holds no trials")
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
        return sorted(self._baselines.get(problem, {}).values(), key=lambda b: b.median_us)

    def measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                range_prefix: str = "") -> Measurement:
        if self._delay:
            time.sleep(self._delay)
        found = self._trials.get((problem, variant.template, canonical_json(variant.stored_params())))
        if found is None:
            return Measurement(status=TrialStatus.PRUNED, error=NOT_RECORDED)
        return Measurement(status=found.status, median_us=found.median_us, p20_us=found.p20_us, p80_us=found.p80_us,
                           rel_error=found.rel_error, error=found.error)

    def confirm(self, problem: Problem, variants: list[Variant], builts: list[Optional[BuiltKernel]],
                rounds: int) -> ConfirmTimings:
        """The recording's figures, the same in every round (it holds one timing per variant)."""
        times: dict[str, tuple[float, ...]] = {}
        for variant in variants:
            found = self._trials.get((problem, variant.template, canonical_json(variant.stored_params())))
            if found is not None and found.status is TrialStatus.OK and found.median_us is not None:
                times[variant.name] = (found.median_us,) * rounds
        for b in self.baselines(problem):
            times[b.impl] = (b.median_us,) * rounds
        return ConfirmTimings(times)

    def close(self) -> None:
        pass


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
