"""Conformance suite of the results store, run on every backend (sqlite, postgres)."""

from __future__ import annotations

import math
from datetime import timezone

import pytest
from store_factories import BIG, H100, H200, SMALL, baseline, trial

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.status import TrialStatus
from tuner.store import NcuMetric, TrialFilter, open_store


def test_new_store_is_at_head(store):
    from tuner.store.engine import head_revision

    assert store.current_revision() == head_revision()
    assert "***" in store.url or "@" not in store.url


def test_run_lifecycle(store):
    run = store.start_run(H100)
    store.finish_run(run)
    with pytest.raises(TunerError, match="no run with id 999"):
        store.finish_run(999)
    t = store.add_trial(trial(run))
    detail = store.trial_detail(t)
    assert detail.run == H100
    assert detail.run_started_at is not None and detail.run_ended_at is not None
    assert detail.run_started_at.tzinfo is not None
    assert detail.run_ended_at >= detail.run_started_at


def test_problem_and_variant_get_or_create(store):
    a = store.problem_id(BIG)
    assert store.problem_id(Problem(16, 16, 2048, 2048, 64)) == a
    assert store.problem_id(SMALL) != a
    assert store.problem_id(Problem(16, 16, 2048, 2048, 64, causal=True)) != a
    v = store.variant_id("t", "h", {"a": 1, "b": [1, 2]}, "t_a1")
    assert store.variant_id("t", "h", {"b": [1, 2], "a": 1}, "other name") == v  # key order is irrelevant
    assert store.variant_id("t", "h2", {"a": 1, "b": [1, 2]}, "t_a1") != v
    assert store.variant_id("t", "h", {"a": 2, "b": [1, 2]}, "t_a2") != v


def test_add_trial_round_trip_and_computed_tflops(store):
    run = store.start_run(H100)
    rec = trial(
        run, p20_us=95.0, p80_us=110.0, rel_error=1e-4, compile_s=2.5, registers=128, smem_bytes=49152,
        spill_bytes=0, cubin_sha256="ab" * 32, source_path="/tmp/k.cu", compile_log="ok", study="s1", trial_number=3,
    )  # fmt: skip
    t = store.add_trial(rec)
    d = store.trial_detail(t)
    assert d.problem == BIG and d.params == rec.params and d.variant_name == rec.variant_name
    assert (d.median_us, d.p20_us, d.p80_us) == (100.0, 95.0, 110.0)
    assert d.tflops == pytest.approx(BIG.tflops(100.0))
    assert (d.registers, d.smem_bytes, d.spill_bytes, d.compile_s) == (128, 49152, 0, 2.5)
    assert (d.study, d.trial_number, d.source_path, d.compile_log) == ("s1", 3, "/tmp/k.cu", "ok")
    assert d.status is TrialStatus.OK and d.created_at.tzinfo == timezone.utc
    assert d.gpu_name == H100.gpu_name and d.profile == "h100"


def test_failed_trials_are_rows(store):
    run = store.start_run(H100)
    for status in TrialStatus:
        store.add_trial(trial(run, params={"s": status.value}, status=status, median_us=None, error=f"{status} [x]"))
    rows = store.query_trials(TrialFilter())
    assert {r.status for r in rows} == set(TrialStatus)
    failed = store.query_trials(TrialFilter(status="compile_error"))
    assert len(failed) == 1 and failed[0].error == "compile_error [x]" and failed[0].tflops is None
    with pytest.raises(TunerError, match="unknown trial status"):
        store.add_trial(trial(run, status="exploded"))


def test_trial_with_unknown_run_is_refused(store):
    with pytest.raises(TunerError, match="no run with id 77"):
        store.add_trial(trial(77))


def test_nan_is_stored_as_null_and_nul_chars_replaced(store):
    run = store.start_run(H100)
    t = store.add_trial(trial(run, status="incorrect", rel_error=math.nan, error="bad\x00byte"))
    d = store.trial_detail(t)
    assert d.rel_error is None and d.error == "bad\ufffdbyte"


def test_ratio_to_best_baseline(store):
    run = store.start_run(H100)
    fast = store.add_trial(trial(run, params={"m": 1}, median_us=80.0))
    store.add_baseline(baseline(run, impl="sdpa_flash", median_us=120.0))
    store.add_baseline(baseline(run, impl="sdpa_cudnn", median_us=100.0))
    other_run = store.start_run(H100)
    store.add_baseline(baseline(other_run, impl="sdpa_cudnn", median_us=10.0))  # another run: ignored
    row = store.trial_detail(fast)
    assert row.ratio_to_best_baseline == pytest.approx(100.0 / 80.0)
    assert row.best_baseline_impl == "sdpa_cudnn" and row.best_baseline_us == 100.0
    assert [b.impl for b in row.baselines] == ["sdpa_cudnn", "sdpa_flash"]
    assert [b.impl for b in store.baselines_for(run, row.problem_id)] == ["sdpa_cudnn", "sdpa_flash"]
    assert row.baselines[0].tflops == pytest.approx(BIG.tflops(100.0))
    no_baseline = store.add_trial(trial(run, SMALL))
    assert store.trial_detail(no_baseline).ratio_to_best_baseline is None


def test_filters(store):
    h100, h200 = store.start_run(H100), store.start_run(H200)
    store.add_trial(trial(h100, BIG, params={"m": 1}))
    store.add_trial(trial(h100, SMALL, params={"m": 1}))
    store.add_trial(trial(h200, BIG, params={"m": 1}, template="other", status="timeout", median_us=None))
    bf16 = Problem(16, 16, 2048, 2048, 64, dtype="bf16")
    store.add_trial(trial(h200, bf16, params={"m": 1}))
    fp8 = Problem(16, 16, 2048, 2048, 64, dtype="e4m3", heads_kv=4, causal=True)
    fp8_id = store.add_trial(trial(h200, fp8, params={"m": 1}))

    def ids(**kw):
        return len(store.query_trials(TrialFilter(**kw)))

    assert ids() == 5
    assert ids(gpu="h100") == 2  # profile, exactly
    assert ids(gpu="H20") == 3  # part of the GPU name, any case
    assert ids(gpu="nvidia") == 5
    assert ids(gpu="h1") == 2  # substring of "NVIDIA H100 ..."
    assert ids(gpu="100%") == 0  # LIKE wildcards are literal
    assert ids(shape=(16, 16, 2048, 2048, 64)) == 4
    assert ids(shape=(1, 8, 512, 64)) == 1  # B,H,S,D form
    assert ids(dtype="bf16") == 1
    [row] = store.query_trials(TrialFilter(dtype="e4m3"))
    assert (row.id, row.problem, row.problem.label) == (fp8_id, fp8, "B16 H16 Hkv4 S2048 D64 e4m3 causal")
    assert ids(causal=True) == 2 and ids(causal=False) == 3
    assert ids(template="other") == 1
    assert ids(status="timeout") == 1 and ids(status=TrialStatus.OK) == 4
    assert ids(run_id=h200) == 3
    assert ids(limit=2) == 2
    assert [r.id for r in store.query_trials(TrialFilter())] == sorted((r.id for r in store.query_trials(TrialFilter())), reverse=True)


def test_best_trials_fastest_ok_per_problem_and_profile(store):
    h100, h100b, h200 = store.start_run(H100), store.start_run(H100), store.start_run(H200)
    store.add_trial(trial(h100, BIG, params={"m": 1}, median_us=90.0))
    winner = store.add_trial(trial(h100b, BIG, params={"m": 2}, median_us=70.0))
    store.add_trial(trial(h100, BIG, params={"m": 3}, median_us=None, status="incorrect"))
    store.add_trial(trial(h100, BIG, params={"m": 4}, median_us=10.0, status="incorrect"))
    small = store.add_trial(trial(h100, SMALL, params={"m": 1}, median_us=20.0))
    h200_best = store.add_trial(trial(h200, BIG, params={"m": 1}, median_us=50.0))
    store.add_trial(trial(h200, BIG, params={"m": 2}, median_us=60.0))
    best = store.best_trials(TrialFilter())
    assert sorted(r.id for r in best) == sorted([winner, small, h200_best])
    assert [r.id for r in store.best_trials(TrialFilter(gpu="h100", shape=(16, 16, 2048, 64)))] == [winner]
    assert store.best_trials(TrialFilter(gpu="nothing")) == []
    with pytest.raises(TunerError):
        store.best_trials(TrialFilter(status="timeout"))


def test_find_trial_for_reuse(store):
    run = store.start_run(H100)
    params = {"BLOCK_M": 64, "BLOCK_N": 64}
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name) is None
    store.add_trial(trial(run, params=params, status="pruned", median_us=None))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name) is None  # pruned is not a measurement
    store.add_trial(trial(run, params=params, status="timeout", median_us=None))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name) is None  # may be transient: measure again
    incorrect = store.add_trial(trial(run, params=params, status="incorrect", median_us=None))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", dict(reversed(params.items())), H100.gpu_name).id == incorrect
    ok = store.add_trial(trial(run, params=params, median_us=55.0))
    store.add_trial(trial(run, params=params, status="launch_error", median_us=None))
    found = store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name)
    assert found.id == ok and found.median_us == 55.0  # an ok measurement wins over a newer failure
    assert store.find_trial(BIG, "attn_fwd_mma", "h2", params, H100.gpu_name) is None
    assert store.find_trial(SMALL, "attn_fwd_mma", "h1", params, H100.gpu_name) is None
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H200.gpu_name) is None


def test_replayed_answers_and_measurements_are_never_reused_for_each_other(store):
    """A replay reports the recording's card: a search measuring that card must not take its answers as
    measurements, and a replay answers from its own recording, not from the card's runs (nor another one's)."""
    from dataclasses import replace

    params = {"BLOCK_M": 64}
    recording, other = "sqlite:///rec.db", "sqlite:///other.db"
    replayed = store.start_run(replace(H100, replayed_from=recording))
    store.add_trial(trial(replayed, params=params, median_us=99.0))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name) is None
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, replayed_from=recording).median_us == 99.0
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, replayed_from=other) is None
    measured = store.start_run(H100)
    store.add_trial(trial(measured, params=params, median_us=55.0))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name).median_us == 55.0
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, replayed_from=recording).median_us == 99.0


def test_reuse_for_an_objective_needs_its_figure(store):
    """A search minimizing J per call (or isolated µs) reuses an ok trial only when it has that figure;
    a failure is reused whatever the objective."""
    from tuner.runtime.energy import Energy

    run = store.start_run(H100)
    params = {"BLOCK_M": 64}
    store.add_trial(trial(run, params=params, median_us=50.0))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name).median_us == 50.0
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, "joules_per_call") is None
    measured = store.add_trial(trial(run, params=params, median_us=51.0, energy=Energy(0.03, 600.0, 1600.0)))
    found = store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, "joules_per_call")
    assert found.id == measured and found.energy == Energy(0.03, 600.0, 1600.0)
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", params, H100.gpu_name, "isolated_us") is None
    wrong = store.add_trial(trial(run, params={"BLOCK_M": 32}, status="incorrect", median_us=None))
    assert store.find_trial(BIG, "attn_fwd_mma", "h1", {"BLOCK_M": 32}, H100.gpu_name, "isolated_us").id == wrong


def test_a_confirm_stage_keeps_each_rounds_energy_and_its_winners_median(store):
    from tuner.runtime.energy import Energy
    from tuner.store import ConfirmRecord

    run = store.start_run(H100)
    winner = store.add_trial(trial(run, median_us=100.0, energy=Energy(0.07, 700.0, 1500.0)))
    e1, e2 = Energy(0.069, 690.0, 1510.0), Energy(0.071, 710.0, 1490.0)
    confirmation = store.add_confirmation(ConfirmRecord(
        run_id=run, problem=BIG, rounds=2, objective="energy", winner_trial_id=winner, winner_us=100.0,
        winner_ratio=1.3, baseline_impl="sdpa_flash", winner_joules_per_call=0.07,
        timings={"v": (winner, (99.0, 101.0)), "sdpa_flash": (None, (130.0, 131.0))},
        energy={"v": (e1, e2), "sdpa_flash": (None, e1)}, isolated_us={"v": (80.0, 81.0)}))
    assert store.confirm_timings(confirmation) == {"sdpa_flash": [130.0, 131.0], "v": [99.0, 101.0]}
    assert store.confirm_energy(confirmation) == {"sdpa_flash": [None, e1], "v": [e1, e2]}
    assert store.confirm_isolated(confirmation) == {"sdpa_flash": [None, None], "v": [80.0, 81.0]}
    [best] = store.prefer_confirmed(store.best_trials(TrialFilter()))
    assert (best.confirmed_objective, best.confirmed_joules_per_call, best.headline_joules) == ("energy", 0.07, 0.07)
    assert best.tflops_per_watt == pytest.approx(BIG.flops * 1e-12 / 0.07)


def test_ncu_metrics_upsert(store):
    run = store.start_run(H100)
    t = store.add_trial(trial(run))
    store.add_ncu_metrics(t, [NcuMetric("sm__throughput.avg.pct_of_peak_sustained_elapsed", 71.5, "%"),
                              NcuMetric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", 1024.0)])  # fmt: skip
    store.add_ncu_metrics(t, [NcuMetric("sm__throughput.avg.pct_of_peak_sustained_elapsed", 80.0, "pct")])
    store.add_ncu_metrics(t, [])
    metrics = {m.name: m for m in store.trial_detail(t).ncu_metrics}
    assert len(metrics) == 2
    assert metrics["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == NcuMetric(
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", 80.0, "pct"
    )
    with pytest.raises(TunerError, match="no trial with id 4242"):
        store.add_ncu_metrics(4242, [NcuMetric("x", 1.0)])


def test_unknown_trial_detail(store):
    with pytest.raises(TunerError, match="^no trial with id 42$"):
        store.trial_detail(42)


def test_reopen_sees_data(store_url):
    with open_store(store_url) as first:
        run = first.start_run(H100)
        first.add_trial(trial(run))
    with open_store(store_url, create=False) as second:
        assert len(second.query_trials(TrialFilter())) == 1


def test_to_dict_and_csv_row_are_plain(store):
    import json

    run = store.start_run(H100)
    store.add_baseline(baseline(run))
    t = store.add_trial(trial(run))
    store.add_ncu_metrics(t, [NcuMetric("a", 1.0)])
    row = store.query_trials(TrialFilter())[0]
    data = json.loads(json.dumps(row.to_dict()))
    assert data["status"] == "ok" and data["problem"]["head_dim"] == 64 and data["problem_label"] == BIG.label
    assert set(row.csv_row()) == set(row.CSV_FIELDS)
    detail = json.loads(json.dumps(store.trial_detail(t).to_dict()))
    assert detail["ncu_metrics"] == [{"name": "a", "value": 1.0, "unit": None}]
    assert detail["baselines"][0]["impl"] == "sdpa_flash"


def test_run_command_line_never_stores_a_password(store, monkeypatch):
    import sys

    from tuner.store import RunInfo

    monkeypatch.setattr(sys, "argv", ["tuner", "--db", "postgresql://alice:hunter2@db.example/tuner", "search",
                                      "--storage=postgresql://bob:s3cret@db.example/optuna", "--gpu", "h100"])
    info = RunInfo.for_this_process(gpu_name="NVIDIA H100", profile="h100")
    assert "hunter2" not in info.command_line and "s3cret" not in info.command_line
    assert "alice:***@db.example" in info.command_line and "--gpu h100" in info.command_line


def test_gpu_filter_is_exact_for_profile_names(store):
    from tuner.store import RunInfo

    l40s = store.start_run(RunInfo(gpu_name="NVIDIA L40S", profile="l40s"))
    l4 = store.start_run(RunInfo(gpu_name="NVIDIA L4", profile="l4"))
    store.add_trial(trial(l40s, BIG, params={"m": 1}))
    store.add_trial(trial(l4, BIG, params={"m": 1}))
    assert [r.gpu_name for r in store.query_trials(TrialFilter(gpu="l4"))] == ["NVIDIA L4"]
    assert len(store.query_trials(TrialFilter(gpu="L40"))) == 1  # not a profile name: part of the GPU name
