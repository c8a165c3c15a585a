"""`tuner report` on a fixture store: a replayed search of the SYNTHETIC recording (tuner/replay_fixture.py),
plus a triton_fa2 baseline and ncu metrics added by hand. Numbers are made up; what is checked is that the
report shows exactly what the store holds."""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass, replace

import pytest

from tests.cli_helpers import run_tuner
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import BaselineRecord, NcuMetric, TrialFilter, TrialRow, open_store

NCU = [NcuMetric("sm__throughput.avg.pct_of_peak_sustained_elapsed", 71.25, "%"),
       NcuMetric("dram__bytes_read.sum", 12345678.0, "byte")]


@dataclass(frozen=True)
class Fixture:
    url: str
    best: TrialRow
    gpu: str
    triton_us: float


def _replayed_search(recording, db_url: str, trials: int, seed: int = 0) -> None:
    from rich.console import Console

    from tuner.search.options import SearchOptions
    from tuner.search.run import run_search

    p = recording.problem
    run_search(SearchOptions(
        gpu=recording.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",), dtype=p.dtype,
        causal=p.causal, trials=trials, sampler="random", seed=seed, db_url=db_url, backend="replay",
        replay_from=recording.url, warm_start=0,
    ), console=Console(file=io.StringIO()))  # fmt: skip


@pytest.fixture(scope="module")
def report_store(replay_recording, tmp_path_factory) -> Fixture:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'results.db'}"
    _replayed_search(replay_recording, url, trials=40)
    with open_store(url) as store:
        best = store.best_trials(TrialFilter(gpu=replay_recording.profile))[0]
        triton_us = best.median_us * 1.25  # a slower Triton FA2 timed by the same worker
        store.add_baseline(BaselineRecord(run_id=best.run_id, problem=best.problem, impl="triton_fa2",
                                          timing=Timing(triton_us)))
        store.add_ncu_metrics(best.id, NCU)
        best = store.best_trials(TrialFilter(gpu=replay_recording.profile))[0]  # ratio re-read
    return Fixture(url, best, replay_recording.profile, triton_us)


def _assert_png(path: str) -> None:
    from matplotlib.image import imread

    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(pixels.std()) > 0.01  # something was drawn


def test_report_command_writes_markdown_json_and_plots(report_store, tmp_path):
    out = tmp_path / "out"
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", report_store.url, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    names = sorted(os.listdir(out))
    assert "report.md" in names and "report.json" in names
    pngs = [n for n in names if n.endswith(".png")]
    assert any(n.endswith("-compare.png") for n in pngs)
    assert any(n.endswith("-convergence.png") for n in pngs)
    assert any("-importance-" in n for n in pngs)  # 40 random trials: enough complete ones
    for name in pngs:
        _assert_png(str(out / name))
        assert f"]({name})" in (out / "report.md").read_text()  # every figure is in the report


def test_report_numbers_are_the_stores(report_store, tmp_path):
    from tuner.reporting.report import write_report

    files = write_report(report_store.url, report_store.gpu, str(tmp_path))
    data = json.loads(open(files.json).read())
    md = open(files.markdown).read()
    best = report_store.best
    (entry,) = data["problems"]
    assert entry["best_trial_id"] == best.id and entry["run_id"] == best.run_id
    assert entry["best_us"] == best.median_us
    with open_store(report_store.url, create=False) as store:
        baselines = store.baselines_for(best.run_id, best.problem_id)
        trials = store.query_trials(TrialFilter(run_id=best.run_id, status=TrialStatus.OK))
    # the speed-up computed here from the raw rows, not by the store's SQL: baseline µs / tuned µs
    tuned_us = min(r.median_us for r in trials if r.problem == best.problem)
    fastest = min(baselines, key=lambda b: b.median_us)
    assert tuned_us == best.median_us
    assert entry["ratio_to_best_baseline"] == pytest.approx(fastest.median_us / tuned_us, rel=1e-12)
    assert fastest.median_us != tuned_us  # so a flipped ratio (tuned / baseline) would fail the line above
    assert entry["best_baseline_impl"] == fastest.impl
    assert {t["impl"]: t["median_us"] for t in entry["timings"]} == {
        "tuned": best.median_us, **{b.impl: b.median_us for b in baselines}}
    assert entry["ratios"] == {b.impl: b.median_us / best.median_us for b in baselines}
    assert entry["ratios"]["triton_fa2"] == report_store.triton_us / best.median_us
    assert entry["ratios"]["triton_fa2"] == pytest.approx(1.25)  # the fixture made it 1.25x the tuned time
    # the markdown shows the same numbers, rounded
    assert f"| {best.median_us:.3f} |" in md
    assert f"| {fastest.impl} | {fastest.median_us:.3f} | {fastest.median_us / tuned_us:.3f}x |" in md
    assert f"{report_store.triton_us / best.median_us:.3f}x" in md
    for impl in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "triton_fa2"):
        assert impl in md
    for metric in NCU:
        assert metric.name in md
    assert "71.25" in md
    # every figure's caption names the card and the run
    captions = [line for line in md.splitlines() if line.startswith("*Figure")]
    assert captions
    for caption in captions:
        assert best.gpu_name in caption and f"run {best.run_id}" in caption


def test_best_so_far_follows_the_trial_order(report_store):
    from tuner.reporting.report import gather_report

    with open_store(report_store.url, create=False) as store:
        report = gather_report(store, report_store.gpu, db_url=report_store.url)
        rows = store.query_trials(TrialFilter(study=report.problems[0].curves[0].study))
    (curve,) = report.problems[0].curves
    ok = sorted((r for r in rows if r.status is TrialStatus.OK), key=lambda r: r.trial_number)
    expected, best = [], None
    for r in ok:
        best = r.median_us if best is None else min(best, r.median_us)
        expected.append((r.trial_number, best))
    assert list(zip(curve.trial_numbers, curve.best_by_number)) == expected
    assert curve.best_by_number[-1] == report_store.best.median_us
    assert curve.best_by_time[-1] == report_store.best.median_us
    assert list(curve.elapsed_s) == sorted(curve.elapsed_s) and curve.elapsed_s[0] >= 0
    assert curve.trials == len(rows)
    (imp,) = report.problems[0].importances
    assert imp.values and set(imp.values) <= set(report_store.best.params)


def test_a_copied_store_keeps_its_studies(report_store, tmp_path):
    """A store is one file: a copy of it alone still has the Optuna studies behind its parameter importance."""
    source = report_store.url.removeprefix("sqlite:///")
    shutil.copy(source, tmp_path / "copy.db")
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", f"sqlite:///{tmp_path / 'copy.db'}",
                       "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert any("-importance-" in n for n in os.listdir(tmp_path / "out"))
    assert not [n for n in os.listdir(tmp_path) if "journal" in n]  # nothing beside the store was needed or made


def test_missing_optuna_study_is_said_not_fatal(report_store, tmp_path):
    """Trials whose study is not in the store's journal (e.g. written by another tool): the report says so."""
    import sqlite3

    source = report_store.url.removeprefix("sqlite:///")
    shutil.copy(source, tmp_path / "copy.db")
    with sqlite3.connect(tmp_path / "copy.db") as conn:
        conn.execute("DELETE FROM optuna_journal")
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", f"sqlite:///{tmp_path / 'copy.db'}",
                       "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "is not in the Optuna storage" in md
    assert not any("-importance-" in n for n in os.listdir(tmp_path / "out"))


def test_too_few_trials_for_importance_and_no_ncu(replay_recording, tmp_path):
    url = f"sqlite:///{tmp_path / 'small.db'}"
    _replayed_search(replay_recording, url, trials=4, seed=3)
    result = run_tuner("report", "--gpu", replay_recording.profile, "--db", url, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "too few complete trials for parameter importance" in md
    assert "Not profiled: run `tuner profile" in md


def test_report_without_ok_trials_for_the_gpu_is_a_clear_error(report_store, tmp_path):
    other = "a100" if report_store.gpu != "a100" else "l4"  # a shipped profile this store has no trial of
    result = run_tuner("report", "--gpu", other, "--db", report_store.url, "--out", str(tmp_path))
    assert result.exit_code == 2
    assert f"no ok trials for GPU '{other}'" in result.stderr


def test_report_of_an_unknown_gpu_says_so_as_the_other_commands_do(report_store, tmp_path):
    """Neither a profile nor part of a stored card's name: the one-line error of `tuner export --gpu nope`
    (issue 36, item 11), not "no ok trials"."""
    result = run_tuner("report", "--gpu", "nope", "--db", report_store.url, "--out", str(tmp_path / "out"))
    export = run_tuner("export", "--gpu", "nope", "--db", report_store.url, "--out", str(tmp_path / "pkg"))
    assert (result.exit_code, export.exit_code) == (2, 2)
    assert result.stderr.startswith("error: unknown GPU profile 'nope'; known: ")
    assert result.stderr == export.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_summary_row_takes_the_best_baseline_from_the_store_row(report_store):
    """Baseline name, its µs and the speed-up all come from the trial row (the store's one pick, ties included)."""
    from dataclasses import replace

    from tuner.reporting.report import gather_report
    from tuner.reporting.report_markdown import render_markdown

    with open_store(report_store.url, create=False) as store:
        report = gather_report(store, report_store.gpu, db_url=report_store.url)
    (p,) = report.problems
    # a store that broke a tie the other way: the summary must follow it, not re-pick from the timings
    best = replace(p.best, best_baseline_impl="sdpa_efficient", best_baseline_us=123.456, ratio_to_best_baseline=9.5)
    md = render_markdown(replace(report, problems=(replace(p, best=best),)))
    assert "| sdpa_efficient | 123.456 | 9.500x |" in md


def _assert_one_line_error(result, path: str) -> None:
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot write to ") and path in lines[0]


def test_report_out_under_proc_is_a_one_line_error(report_store):
    out = "/proc/tuner-report-out"
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", report_store.url, "--out", out)
    _assert_one_line_error(result, out)


def test_report_out_that_is_a_file_is_a_one_line_error(report_store, tmp_path):
    out = tmp_path / "taken"
    out.write_text("not a folder")
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", report_store.url, "--out", str(out))
    _assert_one_line_error(result, str(out))
    assert "not a folder" in result.stderr and out.read_text() == "not a folder"


def test_nothing_read_from_the_store_chooses_a_path(report_store, tmp_path):
    """A hostile runs.profile (`../../x`) cannot make the report write outside --out."""
    import sqlite3

    source = report_store.url.removeprefix("sqlite:///")
    shutil.copy(source, tmp_path / "evil.db")
    with sqlite3.connect(tmp_path / "evil.db") as conn:
        conn.execute("UPDATE runs SET profile = '../../escaped'")
        gpu_name = conn.execute("SELECT gpu_name FROM runs LIMIT 1").fetchone()[0]
    out = tmp_path / "a" / "b" / "out"
    result = run_tuner("report", "--gpu", gpu_name, "--db", f"sqlite:///{tmp_path / 'evil.db'}", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert not list(tmp_path.rglob("escaped*")) or all(out in p.parents for p in tmp_path.rglob("*escaped*"))
    written = [p for p in tmp_path.rglob("*.png")]
    assert written and all(p.parent == out for p in written)


def test_a_report_of_a_replayed_search_says_so(report_store, tmp_path):
    """report_store was filled by `tuner search --backend replay`: its numbers were measured by the recording."""
    out = tmp_path / "out"
    result = run_tuner("report", "--gpu", report_store.gpu, "--db", report_store.url, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    md = (out / "report.md").read_text()
    assert "**REPLAYED**" in md and "REPLAYED from a recording" in md
    data = json.loads((out / "report.json").read_text())
    assert all(p["replayed_from"] for p in data["problems"])


def test_the_report_shows_the_confirm_stage_in_search_vs_confirmed(replay_recording, tmp_path):
    from rich.console import Console

    from tuner.search.options import SearchOptions
    from tuner.search.run import run_search

    url = f"sqlite:///{tmp_path / 'c.db'}"
    p = replay_recording.problem
    run_search(SearchOptions(gpu=replay_recording.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                             dtype=p.dtype, causal=p.causal, backend="replay", replay_from=replay_recording.url,
                             db_url=url, trials=20, seed=2, confirm=3, confirm_rounds=2),
               console=Console(file=io.StringIO()))
    out = tmp_path / "out"
    result = run_tuner("report", "--gpu", replay_recording.profile, "--db", url, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    md = (out / "report.md").read_text()
    assert "### Confirm stage" in md and "(winner)" in md and "in-search µs" in md
    assert any(n.endswith("-confirm.png") for n in os.listdir(out))
    [problem] = json.loads((out / "report.json").read_text())["problems"]
    assert len(problem["confirm"]["variants"]) == 3 and problem["confirm"]["rounds"] == 2


def test_a_runs_report_shows_no_confirm_stage_that_did_not_re_time_its_best(replay_recording, tmp_path):
    """`report --run N` of a search without a confirm stage does not show another run's stage (of other trials)
    as its own; the run that confirmed shows its stage."""
    from rich.console import Console

    from tuner.reporting.report import gather_report
    from tuner.search.options import SearchOptions
    from tuner.search.run import run_search
    from tuner.store import open_store

    url = f"sqlite:///{tmp_path / 'c.db'}"
    p = replay_recording.problem
    base = SearchOptions(gpu=replay_recording.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                         dtype=p.dtype, causal=p.causal, backend="replay", replay_from=replay_recording.url, db_url=url)
    quiet = Console(file=io.StringIO())
    confirmed = run_search(replace(base, trials=10, seed=2, confirm=3, confirm_rounds=2, study="a"), console=quiet)
    plain = run_search(replace(base, trials=25, seed=9, confirm=0, study="b", warm_start=0), console=quiet)
    with open_store(url) as store:
        [mine] = gather_report(store, replay_recording.profile, db_url=url, run_id=plain.run_ids[0]).problems
        assert mine.best.run_id == plain.run_ids[0] and mine.confirm is None
        [theirs] = gather_report(store, replay_recording.profile, db_url=url, run_id=confirmed.run_ids[0]).problems
        assert theirs.confirm is not None and theirs.confirm.run_id == confirmed.run_ids[0]


def test_the_report_shows_energy_beside_time_for_the_tuned_kernel_and_each_baseline(tmp_path):
    """A replayed energy search of a synthetic recording with energy: the report's J per call, power and
    TFLOP/s per W are the store's, for the tuned kernel and each baseline of its run."""
    from tuner.backends.synthetic import write_synthetic_recording
    from tuner.problem import Problem
    from tuner.reporting.report import write_report
    from tuner.search.options import SearchOptions
    from tuner.search.run import run_search

    from rich.console import Console

    recording, url = f"sqlite:///{tmp_path / 'rec.db'}", f"sqlite:///{tmp_path / 'results.db'}"
    write_synthetic_recording(recording, [Problem(1, 8, 512, 512, 64)])
    run_search(SearchOptions(gpu="h100", shapes=("1,8,512,64",), template="attn_fwd_mma", trials=15, seed=1,
                             db_url=url, backend="replay", replay_from=recording, objective="energy", confirm=3,
                             confirm_rounds=2), console=Console(file=io.StringIO()))
    files = write_report(url, "h100", str(tmp_path / "out"))
    data, md = json.loads(open(files.json).read()), open(files.markdown).read()
    with open_store(url) as store:
        best = store.best_trials(TrialFilter(gpu="h100"))[0]
        baselines = store.baselines_for(best.run_id, best.problem_id)
    (entry,) = data["problems"]
    timings = {t["impl"]: t for t in entry["timings"]}
    assert timings["tuned"]["joules_per_call"] == best.energy.joules_per_call
    assert timings["tuned"]["tflops_per_watt"] == pytest.approx(best.tflops / best.energy.power_w)
    for b in baselines:
        assert (timings[b.impl]["joules_per_call"], timings[b.impl]["power_w"]) == (b.energy.joules_per_call,
                                                                                    b.energy.power_w)
        assert f"| {b.impl} | {b.median_us:.3f} | {b.tflops:.1f} | {b.energy.joules_per_call:.4g} | " \
               f"{b.energy.power_w:.0f} | {b.tflops_per_watt:.3f} |" in md
    assert "| implementation | µs | TFLOP/s | J/call | W | TFLOP/s per W | speed-up of tuned |" in md
    assert entry["confirm"]["objective"] == "energy" and "median per-round ratio of J per call" in md
