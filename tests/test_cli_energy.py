"""`tuner show` and `tuner results` put J per call and TFLOP/s per watt beside µs, for the variant and
each baseline; a store without energy shows the tables it always did."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import run_tuner
from store_factories import BIG, H100, baseline, trial

from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timing
from tuner.store import BaselineRecord, ConfirmRecord, open_store

WIDE = {"COLUMNS": "160", "TUNER_DB": None}
TUNED = Energy(0.035, 700.0, 1500.0)  # 50 µs at 700 W
CUDNN = Energy(0.0455, 650.0, 1600.0)  # 70 µs at 650 W


@pytest.fixture
def energy_store(sqlite_url):
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        tuned = store.add_trial(trial(run, BIG, median_us=50.0, energy=TUNED, isolated_us=41.5))
        store.add_baseline(BaselineRecord(run_id=run, problem=BIG, impl="sdpa_cudnn", timing=Timing(70.0, energy=CUDNN)))
        store.add_baseline(baseline(run, BIG, "sdpa_flash", 90.0))  # timed without energy
    return sqlite_url, tuned


def test_show_prints_the_trials_energy_and_each_baselines(energy_store):
    url, tuned = energy_store
    result = run_tuner("--db", url, "show", str(tuned), env=WIDE)
    assert result.exit_code == 0, result.stderr
    tflops_per_w = BIG.flops * 1e-12 / 0.035
    assert f"energy (back to back): 0.035 J/call at 700 W, SM 1500 MHz; {tflops_per_w:.3f} TFLOP/s per W" in result.stdout
    assert "isolated calls: 41.50 µs median" in result.stdout
    header = next(line for line in result.stdout.splitlines() if "J/call" in line and "impl" in line)
    assert "TF/W" in header
    cudnn = next(line for line in result.stdout.splitlines() if line.startswith("sdpa_cudnn"))
    assert "0.0455" in cudnn and f"{BIG.tflops(70.0) / 650.0:.3f}" in cudnn
    flash = next(line for line in result.stdout.splitlines() if line.startswith("sdpa_flash"))
    assert re.search(r"\s-\s+-\s+1\.800x$", flash)  # no energy: dashes, not zeros


def test_results_add_mj_and_tflops_per_watt_columns(energy_store):
    url, tuned = energy_store
    result = run_tuner("--db", url, "results", env=WIDE)
    assert result.exit_code == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "variant" in line)
    assert re.search(r"TFLOP/s +mJ +TF/W +x best", header)
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith(str(tuned)))
    assert re.search(rf"50\.0 +{BIG.tflops(50.0):.1f} +35 +{BIG.flops * 1e-12 / 0.035:.2f} +1\.40x", row)
    [entry] = json.loads(run_tuner("--db", url, "results", "--format", "json", env=WIDE).stdout)
    assert entry["energy"] == {"joules_per_call": 0.035, "power_w": 700.0, "sm_mhz": 1500.0, "window_ms": None}
    assert entry["isolated_us"] == 41.5 and entry["best_baseline_energy"]["joules_per_call"] == 0.0455
    narrow = run_tuner("--db", url, "results", env={"COLUMNS": "80", "TUNER_DB": None})
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines() if not line.startswith("store: "))


def test_a_confirmed_winner_shows_the_confirm_stages_j_per_call(energy_store):
    url, tuned = energy_store
    with open_store(url) as store:
        run = store.trial_detail(tuned).run_id
        store.add_confirmation(ConfirmRecord(
            run_id=run, problem=BIG, rounds=3, objective="energy", winner_trial_id=tuned, winner_us=51.0,
            winner_ratio=1.31, baseline_impl="sdpa_cudnn", winner_joules_per_call=0.0348,
            timings={"v": (tuned, (51.0, 51.0, 51.0)), "sdpa_cudnn": (None, (70.0, 70.0, 70.0))}))
    shown = run_tuner("--db", url, "show", str(tuned), env=WIDE).stdout
    assert ("confirmed: winner of the confirm stage of run 1: 51.00 µs, 0.0348 J/call, median of 3 interleaved "
            "rounds, 1.310x sdpa_cudnn (median per-round ratio of energy)") in shown
    best = run_tuner("--db", url, "results", "--best", env=WIDE).stdout
    row = next(line for line in best.splitlines() if line.strip().startswith(str(tuned)))
    assert re.search(r" 34\.8 +\d+\.\d\d +1\.31x c", row)  # the confirmed J per call, the confirmed ratio


def test_timings_without_energy_show_no_energy_columns_and_a_dash_in_show(sqlite_url):
    """A search's trials are timed without the energy meter (but with --objective energy), as were stores
    before energy: no energy columns, and `show` says the trial's energy was not metered."""
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        tuned = store.add_trial(trial(run, BIG, median_us=50.0))
        store.add_baseline(baseline(run, BIG, "sdpa_cudnn", 70.0))
    results = run_tuner("--db", sqlite_url, "results", env=WIDE).stdout
    shown = run_tuner("--db", sqlite_url, "show", str(tuned), env=WIDE).stdout
    assert "mJ" not in results and "TF/W" not in results
    assert "J/call" not in shown and "isolated" not in shown
    assert "energy (back to back): - (not metered" in shown


def test_show_gives_a_decode_step_its_k_v_bandwidth(sqlite_url):
    """A short-query trial reads as bytes over time (K and V of each row's keys once, in their dtype, and the share
    of the profile's bandwidth); a prefill trial has no such line."""
    from tuner.problem import Problem
    from tuner.profiles import load_profile

    cache = Problem(8, 32, 1, 8192, 128, dtype="bf16_kv_e4m3", heads_kv=8)
    with open_store(sqlite_url) as store:
        run = store.start_run(H100)
        step = store.add_trial(trial(run, cache, median_us=53.2))
        prefill = store.add_trial(trial(run, BIG, median_us=50.0))
    shown = run_tuner("--db", sqlite_url, "show", str(step), env=WIDE)
    assert shown.exit_code == 0, shown.stderr
    gbs = 2 * 8 * 8192 * 8 * 128 / 53.2e-6 / 1e9  # one byte a K/V element
    share = gbs / load_profile("h100").mem_bandwidth_gbs
    assert (f"K/V bandwidth: {gbs:.0f} GB/s (134.2 MB of K and V read once, {share:.0%} of the h100 profile's "
            f"bandwidth)") in " ".join(shown.stdout.split())
    assert "K/V bandwidth" not in run_tuner("--db", sqlite_url, "show", str(prefill), env=WIDE).stdout


def test_kv_bytes_count_each_row_s_keys_its_window_and_the_k_v_dtype() -> None:
    from tuner.problem import Problem

    dense = Problem(2, 8, 1, 1000, 64, dtype="bf16", heads_kv=2)
    assert dense.kv_bytes == 2 * 2 * 1000 * 2 * 64 * 2
    assert Problem(2, 8, 1, 1000, 64, dtype="bf16_kv_e4m3", heads_kv=2).kv_bytes == dense.kv_bytes // 2
    windowed = Problem(2, 8, 4, 1000, 64, dtype="bf16", heads_kv=2, causal=True, window_left=99)
    assert windowed.kv_bytes == 2 * 2 * 103 * 2 * 64 * 2  # the last query's window reaches 99 + 4 keys back
    ragged = Problem(3, 8, 1, 1000, 64, dtype="bf16", heads_kv=2, lengths="uniform:10")
    assert ragged.kv_bytes == 2 * sum(ragged.key_lengths()) * 2 * 64 * 2
    assert dense.kv_gbs(10.0) == dense.kv_bytes / 10e3
