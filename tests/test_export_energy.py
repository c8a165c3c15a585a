"""The export manifest's entries record energy beside time, for the kernel and its best baseline."""

from __future__ import annotations

import types

import pytest
from store_factories import BIG, H100, trial

from tuner.export.selection import ExportedKernel, entry_of
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.store import BaselineRecord, ConfirmRecord, TrialFilter, open_store

KERNEL = ExportedKernel(types.SimpleNamespace(variant=types.SimpleNamespace(name="attn_fwd_mma_x")), b"", False)


def _entry(store, row):
    return entry_of(row, KERNEL, store.trial_detail(row.id).run, None)


def test_an_entry_records_the_kernels_and_its_best_baselines_energy(sqlite_url):
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        tuned = store.add_trial(trial(run, BIG, median_us=50.0, energy=Energy(0.035, 700.0, 1500.0)))
        store.add_baseline(BaselineRecord(run_id=run, problem=BIG, impl="sdpa_cudnn",
                                          timing=Timing(70.0, energy=Energy(0.0455, 650.0, 1600.0))))
        [row] = store.prefer_confirmed(store.best_trials(TrialFilter()))
        entry = _entry(store, row)
        assert (entry["joules_per_call"], entry["power_w"], entry["sm_mhz"]) == (0.035, 700.0, 1500.0)
        assert entry["tflops_per_watt"] == pytest.approx(BIG.tflops(50.0) / 700.0)
        assert (entry["best_baseline_joules_per_call"], entry["best_baseline_power_w"],
                entry["best_baseline_sm_mhz"]) == (0.0455, 650.0, 1600.0)
        assert entry["best_baseline_tflops_per_watt"] == pytest.approx(BIG.tflops(70.0) / 650.0)
        # A confirmed winner's J per call is the confirm stage's median, like its µs.
        store.add_confirmation(ConfirmRecord(
            run_id=run, problem=BIG, rounds=1, objective="energy", winner_trial_id=tuned, winner_us=52.0,
            winner_ratio=1.3, baseline_impl="sdpa_cudnn", winner_joules_per_call=0.034,
            timings={"v": (tuned, (52.0,)), "sdpa_cudnn": (None, (70.0,))}))
        [confirmed] = store.prefer_confirmed(store.best_trials(TrialFilter()))
        entry = _entry(store, confirmed)
        assert (entry["median_us"], entry["joules_per_call"]) == (52.0, 0.034)
        assert entry["tflops_per_watt"] == pytest.approx(BIG.flops * 1e-12 / 0.034)


def test_an_entry_without_energy_says_none(sqlite_url):
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        store.add_trial(trial(run, BIG, median_us=50.0))
        [row] = store.best_trials(TrialFilter())
        entry = _entry(store, row)
    keys = ("joules_per_call", "power_w", "sm_mhz", "tflops_per_watt", "best_baseline_joules_per_call",
            "best_baseline_power_w", "best_baseline_sm_mhz", "best_baseline_tflops_per_watt")
    assert {key: entry[key] for key in keys} == dict.fromkeys(keys)
