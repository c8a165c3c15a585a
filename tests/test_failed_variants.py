"""A variant that failed (launch_error, timeout) is one of the study's points like any other (issue 36, item 4):
a re-proposal is answered from the store, never measured or counted again, so --trials N buys N distinct
variants. Replay-style backends, no GPU."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tuner.backends.base import DeviceFacts, Measurement
from tuner.backends.replay import ReplayBackend
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.search.hooks import Hooks
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.samplers import study_name
from tuner.search.study import counts_toward_budget, finished_trials, storage_for
from tuner.status import TrialStatus


def _failure_of(name: str) -> TrialStatus | None:
    """About a third of the variants fault, a sixth hang (fixed per name, as a broken kernel does)."""
    h = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 6
    return {0: TrialStatus.LAUNCH_ERROR, 1: TrialStatus.LAUNCH_ERROR, 2: TrialStatus.TIMEOUT}.get(h)


class _FailingReplay:
    """The replay backend, but some variants fail; counts how often each variant is measured."""

    needs_compile = False

    def __init__(self, recording) -> None:
        self.inner = ReplayBackend(recording.url, load_profile(recording.profile))
        self.measured: Counter[str] = Counter()

    def device_facts(self):
        return self.inner.device_facts()

    def baselines(self, problem):
        return self.inner.baselines(problem)

    def measure(self, problem, variant, built, *, range_prefix=""):
        self.measured[variant.name] += 1
        failure = _failure_of(variant.name)
        if failure is not None:
            return Measurement(status=failure, error=f"{failure.value} (test)")
        return self.inner.measure(problem, variant, built)

    def confirm(self, *args, **kwargs):
        return self.inner.confirm(*args, **kwargs)

    def close(self) -> None:
        pass


def _options(recording, db_url: str, **changes) -> SearchOptions:
    p = recording.problem
    base = SearchOptions(gpu=recording.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                         dtype=p.dtype, causal=p.causal, backend="replay", replay_from=recording.url, db_url=db_url,
                         trials=60, seed=5, confirm=0)
    return replace(base, **changes)


def test_a_failed_variant_is_measured_once_and_trials_are_distinct(replay_recording, sqlite_url):
    rec = replay_recording
    backend = _FailingReplay(rec)
    report = run_search(_options(rec, sqlite_url), hooks=Hooks(make_backend=lambda *_a, **_k: backend))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    budgeted = [t for t in study.trials if counts_toward_budget(t)]
    assert finished_trials(study) == len(budgeted) == 60
    assert len({tuple(sorted(t.params.items())) for t in budgeted}) == 60  # N trials, N distinct variants
    failed = [name for name in backend.measured if _failure_of(name) is not None]
    assert failed  # there were failures to measure twice
    assert max(backend.measured.values()) == 1, backend.measured.most_common(3)


class _AllFault:
    """Every variant of the three-point attn_fault space faults (no GPU)."""

    needs_compile = False

    def __init__(self, status: TrialStatus) -> None:
        self.status, self.measured = status, Counter()

    def device_facts(self) -> DeviceFacts:
        return DeviceFacts("Fake GPU")

    def baselines(self, problem):
        return []

    def measure(self, problem, variant, built, *, range_prefix=""):
        self.measured[variant.name] += 1
        return Measurement(self.status, error="illegal address (test)")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("status", [TrialStatus.LAUNCH_ERROR, TrialStatus.TIMEOUT])
def test_a_space_of_failing_variants_is_measured_once_each(sqlite_url, monkeypatch, status):
    """Ten trials asked of a three-point space that always faults: three measured, the re-proposals free,
    and the search stops as exhausted (it measured the same three again and again, counting each)."""
    from tuner.kernels import manifest, variant

    monkeypatch.setenv("TUNER_TEMPLATE_PATH", str(Path(__file__).parent / "data" / "kernel_templates"))
    manifest.load_manifest.cache_clear()
    variant._name_regex.cache_clear()
    backend = _AllFault(status)
    try:
        opts = SearchOptions(gpu="h200", shapes=("1,8,512,64",), template="attn_fault", backend="replay",
                             replay_from="sqlite:///unused.db", db_url=sqlite_url, trials=10, sampler="random",
                             seed=1, confirm=0)
        report = run_search(opts, hooks=Hooks(make_backend=lambda *_a, **_k: backend))
    finally:
        manifest.load_manifest.cache_clear()
        variant._name_regex.cache_clear()
    study = optuna.load_study(study_name=study_name("h200", "attn_fault", Problem(1, 8, 512, 512, 64)),
                              storage=storage_for(sqlite_url))
    assert len(backend.measured) == 3 and set(backend.measured.values()) == {1}
    assert finished_trials(study) == 3 and report.measured == 3
    assert report.exhausted


@pytest.mark.parametrize("status", ["launch_error", "timeout"])
def test_find_trial_answers_a_failure_within_its_own_study_only(store, status):
    """A study's own timeout or launch error is its answer for the point; another study measures it again."""
    from store_factories import BIG, H100, trial

    run = store.start_run(H100)
    params = {"BLOCK_M": 64, "BLOCK_N": 64}
    failed = store.add_trial(trial(run, params=params, status=status, median_us=None, study="s1", trial_number=0))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name) is None
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, study="s2") is None
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, study="s1").id == failed
    ok = store.add_trial(trial(run, params=params, median_us=55.0, study="s2", trial_number=0))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, study="s1").id == ok  # ok first
