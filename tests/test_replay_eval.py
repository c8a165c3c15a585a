"""`tuner replay-eval` on the replay recording (SYNTHETIC unless tests/data holds a real one)."""

from __future__ import annotations

import csv
import math
import os

import pytest

from tests.cli_helpers import run_tuner
from tuner.backends.replay import NOT_RECORDED
from tuner.errors import TunerError
from tuner.kernels.feasibility import check
from tuner.kernels.variant import Variant
from tuner.profiles import load_profile
from tuner.reporting.replay_eval import evaluate_samplers, load_recording, summarise
from tuner.reporting.replay_eval_model import EvalOptions, SeedRun
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store


def _shape(problem) -> str:
    return f"{problem.batch},{problem.heads},{problem.seq_q},{problem.seq_k},{problem.head_dim}"


def _recorded_best(recording) -> float:
    """Independently of tuner.reporting.replay_eval: the fastest ok trial of the problem in the recording."""
    with open_store(recording.url, create=False) as store:
        rows = store.query_trials(TrialFilter(status=TrialStatus.OK))
    return min(r.median_us for r in rows if r.problem == recording.problem and r.gpu_name == recording.gpu_name)


def test_trials_to_within_x_percent_match_an_independent_search(replay_recording, tmp_path):
    """Replay-eval's count for (random, seed 1) equals what the trial order of a plain `tuner search
    --backend replay` with the same sampler and seed gives."""
    trials, pcts = 100, (1.0, 3.0, 50.0)
    result = evaluate_samplers(EvalOptions(replay_recording.url, samplers=("random",), seeds=2, trials=trials,
                                           jobs=1, thresholds_pct=pcts))
    best_us = _recorded_best(replay_recording)
    assert result.recording.best_us == best_us

    db = f"sqlite:///{tmp_path / 'independent.db'}"
    run = run_tuner("search", "--backend", "replay", "--from", replay_recording.url, "--gpu", replay_recording.profile,
                    "--shape", _shape(replay_recording.problem), "--dtype", replay_recording.problem.dtype,
                    "--sampler", "random", "--seed", "1", "--trials", str(trials), "--db", db)
    assert run.exit_code == 0, run.stderr
    with open_store(db, create=False) as store:
        all_rows = store.query_trials(TrialFilter())
    rows = [r for r in all_rows if r.status is TrialStatus.OK]
    ok_in_order = sorted(rows, key=lambda r: r.trial_number)
    # Infeasible points, and points the recording never measured, are not budgeted trials: a trial's
    # position skips them.
    profile = load_profile(replay_recording.profile)
    infeasible = [r.trial_number for r in all_rows if r.status is TrialStatus.PRUNED
                  and (r.error == NOT_RECORDED or not check(Variant.from_stored(r.template, r.params), r.problem,
                                                            profile))]
    assert infeasible  # the recording's space has some: the skip is exercised

    budgeted = sorted({r.trial_number for r in all_rows} - set(infeasible))  # repeats leave no row at all

    def position(row) -> int:
        return budgeted.index(row.trial_number) + 1

    (summary,) = result.summaries
    for pct in pcts:
        target = best_us * (1 + pct / 100)
        expected = next((position(r) for r in ok_in_order if r.median_us <= target), None)
        assert summary.reached[pct][1] == expected, pct
    assert summary.reached[50.0][1] is not None  # the check is not vacuous: 50% is reached in 100 trials
    # the whole best-so-far curve agrees too
    run1 = summary.runs[1]
    assert len(run1.best_so_far) == trials
    for r in ok_in_order:
        assert run1.best_so_far[position(r) - 1] <= r.median_us


def _run(sampler: str, seed: int, curve: list) -> SeedRun:
    return SeedRun(sampler, seed, tuple(curve), 0.1)


def test_medians_count_not_reached_as_infinity_and_ties_break_on_3_percent(replay_recording):
    rec = load_recording(replay_recording.url)
    b = rec.best_us
    at = lambda pct: b * (1 + pct / 100)  # noqa: E731
    runs = [
        # "a": within 1% at trials 2 and 4, never for seed 2 -> median 4; within 3% at 1, 1, 2 -> 1
        _run("a", 0, [at(2), at(0.5), at(0.5), at(0.5), at(0.5)]),
        _run("a", 1, [at(2.5), at(2), at(2), at(0.9), at(0.9)]),
        _run("a", 2, [None, at(2), at(2), at(2), at(2)]),
        # "b": within 1% at 4, 4, never -> median 4 (tie); within 3% at 3, 3, 3 -> 3: "a" wins the tie
        _run("b", 0, [None, None, at(3.5), at(1), at(1)]),
        _run("b", 1, [at(9), at(9), at(3), at(0), at(0)]),
        _run("b", 2, [at(9), at(9), at(2), at(2), at(2)]),
        # "c": never within 1% in two of three seeds -> median infinity
        _run("c", 0, [at(0), at(0), at(0), at(0), at(0)]),
        _run("c", 1, [None] * 5),
        _run("c", 2, [at(5)] * 5),
    ]
    result = summarise(rec, runs, trials=5, seeds=3)
    by = {s.sampler: s for s in result.summaries}
    assert by["a"].reached[1.0] == (2, 4, None) and by["a"].median(1.0) == 4
    assert by["a"].spread(1.0) == (2, math.inf) and by["a"].hits(1.0) == 2
    assert by["b"].reached[1.0] == (4, 4, None) and by["b"].median(1.0) == 4
    assert by["a"].median(3.0) == 1 and by["b"].median(3.0) == 3
    assert math.isinf(by["c"].median(1.0))
    assert result.best is by["a"]
    assert result.best_line().startswith("best sampler: a (median trials to within 1%: 4; to within 3%: 1;")
    nothing = summarise(rec, [_run("c", 0, [None] * 5), _run("c", 1, [at(5)] * 5)], trials=5, seeds=2)
    assert nothing.best is None and nothing.best_line().startswith("best sampler: none")


def test_replay_eval_command_writes_table_markdown_csv_and_plot(replay_recording, tmp_path):
    out = tmp_path / "eval"
    result = run_tuner("replay-eval", "--from", replay_recording.url, "--samplers", "random,tpe", "--seeds", "2",
                       "--trials", "15", "--jobs", "2", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "best sampler:" in result.stdout and "random" in result.stdout and "tpe" in result.stdout
    assert sorted(os.listdir(out)) == ["replay_eval.csv", "replay_eval.md", "replay_eval.png"]
    md = (out / "replay_eval.md").read_text()
    assert "best sampler:" in md and replay_recording.gpu_name in md
    if replay_recording.synthetic:
        assert "SYNTHETIC" in md
    with open(out / "replay_eval.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["sampler"], r["seed"]) for r in rows) == [("random", "0"), ("random", "1"), ("tpe", "0"), ("tpe", "1")]
    assert all(r["trials"] == "15" for r in rows)
    from matplotlib.image import imread

    pixels = imread(out / "replay_eval.png")
    assert pixels.shape[0] > 100 and float(pixels.std()) > 0.01


def test_bad_options_are_clear_errors(replay_recording):
    with pytest.raises(TunerError, match="unknown sampler"):
        evaluate_samplers(EvalOptions(replay_recording.url, samplers=("annealing",)))
    with pytest.raises(TunerError, match="no replayable trials for shape"):
        load_recording(replay_recording.url, shape="3,3,96,64")
    result = run_tuner("replay-eval", "--from", replay_recording.url, "--samplers", "nope")
    assert result.exit_code == 2 and "unknown sampler" in result.stderr


# --- an unwritable --out: checked before the evaluation, one line, no traceback ------------------


def _taken(tmp_path) -> str:
    path = tmp_path / "taken"
    path.write_text("not a folder")
    return str(path)


@pytest.mark.parametrize("where", ["proc", "file"])
def test_bad_out_fails_before_any_replay(replay_recording, tmp_path, where):
    out = "/proc/tuner-replay-eval-out" if where == "proc" else _taken(tmp_path)
    replayed = []
    with pytest.raises(TunerError, match="cannot write to") as info:
        evaluate_samplers(EvalOptions(replay_recording.url, samplers=("random",), seeds=1, trials=2, jobs=1,
                                      out_dir=out), progress=replayed.append)
    assert replayed == [] and "\n" not in str(info.value) and out in str(info.value)


@pytest.mark.parametrize("where", ["proc", "file"])
def test_write_outputs_to_a_bad_out_is_a_one_line_error(replay_recording, tmp_path, where):
    from tuner.reporting.replay_eval_output import write_outputs

    rec = load_recording(replay_recording.url)
    result = summarise(rec, [_run("random", 0, [rec.best_us])], trials=1, seeds=1)
    out = "/proc/tuner-replay-eval-out" if where == "proc" else _taken(tmp_path)
    with pytest.raises(TunerError, match="cannot write to") as info:
        write_outputs(result, out)
    assert "\n" not in str(info.value) and out in str(info.value)


@pytest.mark.parametrize("where", ["proc", "file"])
def test_replay_eval_command_bad_out_is_a_one_line_error(replay_recording, tmp_path, where):
    out = "/proc/tuner-replay-eval-out" if where == "proc" else _taken(tmp_path)
    result = run_tuner("replay-eval", "--from", replay_recording.url, "--samplers", "random", "--seeds", "1",
                       "--trials", "2", "--jobs", "1", "--out", out)
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot write to ") and out in errors[0]
    assert result.stderr.splitlines()[-1] == errors[0]


def _noisy_copy(recording, tmp_path, spread: float = 0.08):
    """The recording plus a second run timing every ok variant again, off by up to ±spread, and its
    baselines again: two timings per variant, as benchmarks/record_grid.py writes them."""
    import random
    import shutil

    from tuner.store import BaselineRecord, RunInfo, TrialRecord

    path = tmp_path / "noisy.db"
    shutil.copy(recording.url[len("sqlite:///"):], path)
    url, rng = f"sqlite:///{path}", random.Random(3)
    with open_store(url) as store:
        rows = [r for r in store.query_trials(TrialFilter(status=TrialStatus.OK)) if r.problem == recording.problem]
        run = store.start_run(RunInfo(gpu_name=recording.gpu_name, profile=recording.profile))
        for b in store.baselines_for(rows[0].run_id, rows[0].problem_id):
            store.add_baseline(BaselineRecord(run_id=run, problem=recording.problem, impl=b.impl,
                                              timing=Timing(b.median_us * 1.02, b.median_us, b.median_us)))
        for r in rows:
            store.add_trial(TrialRecord(run_id=run, problem=r.problem, template=r.template, template_hash=r.template_hash,
                                        params=r.params, variant_name=r.variant_name, status=TrialStatus.OK,
                                        timing=Timing(r.median_us * (1 + rng.uniform(-spread, spread)))))
    return url, {r.variant_name: r.median_us for r in rows}


def test_a_noisy_recording_replays_draws_among_its_timings_and_scores_the_picks_by_their_true_time(
        replay_recording, tmp_path):
    from tuner.backends.replay import ReplayBackend
    from tuner.reporting.replay_eval import replay_once

    url, first = _noisy_copy(replay_recording, tmp_path)
    rec = load_recording(url)
    assert rec.timings == 2 and set(rec.true_us) == set(first)
    with open_store(url, create=False) as store:
        again = {r.variant_name: r.median_us for r in store.query_trials(TrialFilter(status=TrialStatus.OK))
                 if r.run_id == max(rec.run_ids)}
    name = rec.best_variant
    assert rec.true_us[name] == pytest.approx((first[name] + again[name]) / 2) == rec.best_us
    # The backend answers with one of the two timings, drawn (seeded), so both come up.
    backend = ReplayBackend(url, load_profile(rec.profile), seed=0)
    variant = Variant.from_stored(rec.template, next(r.params for r in _ok_rows(url) if r.variant_name == name))
    drawn = {backend.measure(rec.problem, variant, None).median_us for _ in range(40)}
    assert drawn == {first[name], again[name]}
    rounds = backend.confirm(rec.problem, [variant], [None], 9).rounds[name]
    assert set(rounds) <= {first[name], again[name]} and len(rounds) == 9
    # A replayed search scores its pick by the true time: regret >= 0, in % above the recorded best.
    run = replay_once(rec, "tpe", 0, 30)
    assert run.regret_pct is not None and run.regret_pct >= 0 and run.confirmed_regret_pct >= 0
    assert min(v for v in run.best_so_far if v is not None) >= rec.best_us  # true times, never below the best


def _ok_rows(url):
    with open_store(url, create=False) as store:
        return store.query_trials(TrialFilter(status=TrialStatus.OK))


def test_replay_eval_markdown_hides_the_recording_url_password(replay_recording):
    """The report names the recording's store as stdout does: a PostgreSQL password (in the userinfo or
    as ?password=) is shown as ***, never in plain text (issue 36, item 7)."""
    from dataclasses import replace

    from tuner.reporting.replay_eval_output import markdown

    rec = replace(load_recording(replay_recording.url),
                  url="postgresql://tuner:s3cr3t@127.0.0.1:55433/rec?sslpassword=k3y")
    md = markdown(summarise(rec, [_run("random", 0, [rec.best_us])], trials=1, seeds=1))
    assert "s3cr3t" not in md and "k3y" not in md
    assert "store postgresql://tuner:***@127.0.0.1:55433/rec?sslpassword=***." in md
