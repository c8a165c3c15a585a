"""One timing value from the GPU worker to the store: a Timing crosses the worker's pipe whole, a trial
carries it into the store, and the store gives it back (SQLite and PostgreSQL) but for what it does not
keep (the repetitions, the energy window). Replay answers with the recorded Timing itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_factories import BIG, H100
from test_gpu_worker import FakeRunner, fake_built

from tuner.backends.base import Measurement
from tuner.backends.gpu import GpuBackend
from tuner.backends.replay import ReplayBackend
from tuner.backends.synthetic import write_synthetic_recording
from tuner.kernels.variant import Variant, parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.search.outcome import trial_record
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
maybe = st.none() | finite
# What the worker measures: every field set, the energy's window and the repetitions included.
energies = st.none() | st.builds(Energy, joules_per_call=finite, power_w=finite, sm_mhz=maybe, window_ms=maybe)
timings = st.builds(Timing, median_us=st.floats(1e-3, 1e6), p20_us=maybe, p80_us=maybe,
                    reps=st.none() | st.integers(1, 100_000), energy=energies, isolated_us=maybe)
SMALL = Problem(1, 8, 512, 512, 64)
VARIANT = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg")


class EchoRunner(FakeRunner):
    """Measures the Timing the request carries (what a CudaRunner's time_call would have returned)."""

    def measure(self, request: dict[str, Any], progress) -> dict[str, Any]:
        return {"status": "ok", "timing": request["echo"], "rel_error": 1e-4}


def kept(timing: Timing) -> Timing:
    """What a store keeps of a timing: all but its repetitions and its energy's window."""
    energy: Optional[Energy] = replace(timing.energy, window_ms=None) if timing.energy else None
    return replace(timing, reps=None, energy=energy)


@pytest.fixture(scope="module")
def backend():
    with GpuBackend(load_profile("h100"), watchdog_s=5.0, runner=EchoRunner, start_timeout_s=120) as gpu:
        yield gpu


def test_a_timing_goes_whole_from_the_worker_through_a_trial_into_the_store(backend, store) -> None:
    run = store.start_run(H100)

    @SETTINGS
    @given(timing=timings)
    def check(timing: Timing) -> None:
        m = backend.measure_request({"problem": BIG, "built": fake_built("ok"), "range_prefix": "", "echo": timing})
        assert m.status is TrialStatus.OK and m.timing == timing  # the same value, reps and window included
        trial_id = store.add_trial(trial_record(run, BIG, "h1", "s", 0, VARIANT, m.status, measurement=m))
        stored = store.trial_detail(trial_id)
        assert stored.timing == kept(timing)
        assert (stored.median_us, stored.energy, stored.isolated_us) == (timing.median_us, kept(timing).energy,
                                                                         timing.isolated_us)

    check()


def test_a_failed_trial_has_no_timing_in_the_store(store) -> None:
    run = store.start_run(H100)
    failed = store.add_trial(trial_record(run, BIG, "h1", "s", 0, VARIANT, TrialStatus.LAUNCH_ERROR, error="x"))
    detail = store.trial_detail(failed)
    assert detail.timing is None and detail.median_us is None and detail.energy is None


def test_a_rows_json_keeps_the_timings_figures_flat(store) -> None:
    """`results --format json` and the CSV show median_us, p20_us, p80_us, energy, isolated_us as before."""
    run = store.start_run(H100)
    timing = Timing(50.0, 49.0, 52.0, 300, Energy(0.035, 700.0, 1500.0, 512.0), 41.5)
    row = store.trial_detail(store.add_trial(trial_record(run, BIG, "h1", "s", 0, VARIANT, TrialStatus.OK,
                                                          measurement=Measurement(TrialStatus.OK, timing))))
    out = row.to_dict()
    assert "timing" not in out
    assert (out["median_us"], out["p20_us"], out["p80_us"], out["isolated_us"]) == (50.0, 49.0, 52.0, 41.5)
    assert out["energy"] == {"joules_per_call": 0.035, "power_w": 700.0, "sm_mhz": 1500.0, "window_ms": None}
    assert row.csv_row()["joules_per_call"] == 0.035 and row.csv_row()["median_us"] == 50.0


def test_replay_and_synthetic_recordings_answer_with_the_same_timing_value(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'synthetic.db'}"
    write_synthetic_recording(url, [SMALL], isolated=True)
    with open_store(url, create=False) as store:
        row = store.query_trials(TrialFilter(status=TrialStatus.OK, limit=1))[0]
        [baseline, *_] = store.baselines_for(row.run_id, row.problem_id)
    assert isinstance(row.timing, Timing) and row.timing.energy is not None and row.timing.p20_us < row.median_us
    variant = Variant.from_stored(row.template, row.params)
    replay = ReplayBackend(url, load_profile("h100"))
    assert replay.measure(SMALL, variant, None).timing == row.timing
    assert {b.impl: b.timing for b in replay.baselines(SMALL)}[baseline.impl] == baseline.timing
    assert replay.confirm(SMALL, [variant], [None], 2).rounds[variant.name] == (row.median_us, row.median_us)
