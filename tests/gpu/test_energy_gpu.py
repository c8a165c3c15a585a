"""Energy on a real card: NVML's counter around a back-to-back timing; a short energy search that stores
energy with its trials, baselines and confirm rounds, and a default one that meters its confirm stage only.

    pytest -m gpu tests/gpu/test_energy_gpu.py -s     (-s shows the measured figures)

Needs nvidia-ml-py (the gpu extra) and a card whose NVML gives the total-energy counter (Volta and later).
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.cli_helpers import run_tuner

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml(gpu_profile):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install '.[gpu]')")
    from tuner.runtime.energy import EnergyMeter

    meter = EnergyMeter(0)
    if not meter.available:
        pytest.skip(f"NVML gives no energy counter here: {meter.why_not}")
    return meter


def test_a_back_to_back_matmul_draws_power_at_a_plausible_clock(nvml) -> None:
    import torch

    from tuner.runtime.timing import time_call, time_cuda

    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    timing = time_cuda(lambda: a @ b, meter=nvml, rep_ms=300.0)
    energy = timing.energy
    print(f"\nmatmul 8192^3 fp16 back to back: {timing.median_us:.1f} µs, {energy}")
    assert energy is not None
    assert 50.0 < energy.power_w < 1000.0, energy
    assert energy.sm_mhz is not None and 200.0 < energy.sm_mhz < 2100.0, energy
    assert energy.joules_per_call == pytest.approx(energy.power_w * timing.median_us * 1e-6, rel=1e-9)
    assert energy.window_ms is not None and energy.window_ms >= 300.0 * 0.5
    both = time_call(lambda: a @ b, meter=nvml, isolated_too=True)
    print(f"the same, isolated calls: {both.isolated_us:.1f} µs (back to back {both.median_us:.1f} µs)")
    assert both.energy is not None and both.isolated_us is not None and both.isolated_us > 0


def test_the_same_calls_timed_twice_read_the_same_power(nvml) -> None:
    """NVML's counter moves in ~100 ms steps: 100 ms windows read 500 or 1050 W for one kernel at a
    700 W limit. A metered block now runs for the meter's window at least, and power is the slope of
    the steps inside it: two blocks of the same calls, on a card already at its steady state, read the
    same power and the same J per call.

    The card is brought to that state first (2 s of the calls back to back, unmetered): a window that
    opens within ~0.1 s of the card leaving idle straddles the power limiter's transient (an H200 read
    729 W at 1538 MHz, above its 700 W limit, then 669 W at 1510 MHz for the same calls), which is the
    card, not the meter. J per call = power x median time: at a lower clock the call takes longer, so
    the two J per call may differ by the clocks' ratio besides the power's own tolerance."""
    import time

    import torch

    from tuner.runtime.timing import time_cuda

    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 4096, dtype=torch.float16, device="cuda")
    settled = time.perf_counter() + 2.0
    while time.perf_counter() < settled:  # back to back, no meter: the power limiter settles
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
    first, second = (time_cuda(lambda: a @ b, meter=nvml, rep_ms=50.0) for _ in range(2))
    print(f"\nthe same matmul twice: {first.energy} / {second.energy}")
    one, two = first.energy, second.energy
    assert one is not None and two is not None
    assert one.window_ms >= nvml.min_window_s * 1000.0 * 0.9
    assert one.power_w == pytest.approx(two.power_w, rel=0.08)
    assert one.sm_mhz and two.sm_mhz
    clocks = abs(one.sm_mhz / two.sm_mhz - 1.0)
    assert one.joules_per_call == pytest.approx(two.joules_per_call, rel=0.08 + clocks)


def test_a_short_search_stores_energy_for_trials_baselines_and_confirm_rounds(gpu_profile, nvml, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'energy.db'}"
    res = run_tuner("--db", url, "search", "--gpu", gpu_profile.name, "--shape", "4,16,2048,64", "--trials", "4",
                    "--seed", "0", "--objective", "energy", "--confirm", "2", "--confirm-rounds", "2")
    assert res.exit_code == 0, res.stderr[-3000:]
    with sqlite3.connect(tmp_path / "energy.db") as db:
        trials = db.execute("SELECT median_us, joules_per_call, power_w, sm_mhz FROM trials WHERE status = 'ok'").fetchall()
        baselines = db.execute("SELECT impl, median_us, joules_per_call, power_w, sm_mhz FROM baselines").fetchall()
        rounds = db.execute("SELECT impl, joules_per_call FROM confirm_timings").fetchall()
        objectives = db.execute("SELECT objective FROM runs").fetchall()
        confirmed = db.execute("SELECT objective, winner_joules_per_call FROM confirmations").fetchall()
    print(f"\ntrials {trials}\nbaselines {baselines}\nconfirm rounds {rounds}\nconfirmations {confirmed}")
    assert trials and all(j is not None and 50.0 < w < 1000.0 and 200.0 < mhz < 2100.0 for _, j, w, mhz in trials)
    assert all(j == pytest.approx(w * us * 1e-6) for us, j, w, _ in trials)
    assert baselines and all(j is not None and 50.0 < w < 1000.0 for _, _, j, w, _ in baselines)
    assert rounds and all(j is not None for _, j in rounds)
    assert objectives == [("energy",)] and confirmed and confirmed[0][0] == "energy" and confirmed[0][1] > 0
    shown = run_tuner("--db", url, "results", "--best")
    assert shown.exit_code == 0 and "mJ" in shown.stdout and "TF/W" in shown.stdout


def test_a_default_search_meters_its_confirm_stage_only(gpu_profile, nvml, tmp_path) -> None:
    """Energy where it decides (issue 38): a search minimizing time (the default) times its trials and baselines
    without the meter (NULL energy), and its confirm stage's rounds too; the energy pass after the race meters the
    winner and its baseline (one 0.5 s block each), stored with the last round; `show` says a trial was not
    metered."""
    url = f"sqlite:///{tmp_path / 'time.db'}"
    res = run_tuner("--db", url, "search", "--gpu", gpu_profile.name, "--shape", "2,16,1024,64", "--trials", "4",
                    "--seed", "0", "--confirm", "2", "--confirm-rounds", "2")
    assert res.exit_code == 0, res.stderr[-3000:]
    with sqlite3.connect(tmp_path / "time.db") as db:
        trials = db.execute("SELECT id, joules_per_call, power_w FROM trials WHERE status = 'ok'").fetchall()
        baselines = db.execute("SELECT joules_per_call FROM baselines").fetchall()
        rounds = db.execute("SELECT impl, round, joules_per_call, power_w FROM confirm_timings").fetchall()
    print(f"\ntrials {trials}\nconfirm rounds {rounds}")
    assert trials and all(j is None and w is None for _, j, w in trials)
    assert baselines and all(j is None for (j,) in baselines)
    last = max(r for _, r, _, _ in rounds)
    assert last == 1 and all(j is None for _, r, j, _ in rounds if r < last)
    metered = [(impl, j, w) for impl, r, j, w in rounds if r == last and j is not None]
    assert len(metered) == 2 and all(50.0 < w < 1000.0 for _, _, w in metered)  # the winner and its baseline
    shown = run_tuner("--db", url, "show", str(trials[0][0]))
    assert shown.exit_code == 0 and "energy (back to back): - (not metered" in shown.stdout
    best = run_tuner("--db", url, "results", "--best")
    assert best.exit_code == 0 and "mJ" in best.stdout  # the confirm stage's J per call
