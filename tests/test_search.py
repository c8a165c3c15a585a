"""The search loop on the replay backend (SYNTHETIC recording unless tests/data holds a real one), no GPU."""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from cli_helpers import run_tuner
from optuna.trial import TrialState
from rich.console import Console

from tuner.backends.base import Measured, Measurement
from tuner.backends.replay import NOT_RECORDED, ReplayBackend
from tuner.cli.tables import short_variant
from tuner.errors import TunerError
from tuner.kernels.compiler import CompileResult
from tuner.kernels.feasibility import check
from tuner.kernels.manifest import load_manifest
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import BuiltKernel, launch_shape
from tuner.runtime.timed import Timing
from tuner.search.hooks import Hooks
from tuner.search.options import SearchOptions
from tuner.search.prepare import prepare_study, warm_start_points
from tuner.search.run import run_join, run_search
from tuner.search.samplers import study_name
from tuner.search.study import (
    ATTR_BUDGET,
    ATTR_INFEASIBLE,
    ATTR_REPEAT,
    ATTR_SOURCE,
    counts_toward_budget,
    finished_trials,
    storage_for,
)
from tuner.status import TrialStatus
from tuner.store import RunInfo, TrialFilter, TrialRecord, open_store


def with_backend(backend) -> Hooks:
    """Hooks whose backend factory always returns `backend` (the builder and clock stay real)."""
    return Hooks(make_backend=lambda *_args, **_kwargs: backend)


def built(variant, compiled: CompileResult) -> BuiltKernel:
    """A BuiltKernel around a made-up compile result (no nvcc)."""
    return BuiltKernel(variant, "", compiled, launch_shape(variant))

WIDE = {"COLUMNS": "250"}


def shape_arg(problem: Problem) -> str:
    return f"{problem.batch},{problem.heads},{problem.seq_q},{problem.seq_k},{problem.head_dim}"


class CountingBackend:
    """The replay backend, recording which variants it measured; optionally interrupts at measure #n."""

    def __init__(self, recording, interrupt_at: int | None = None, needs_compile: bool = False) -> None:
        self.inner = ReplayBackend(recording.url, load_profile(recording.profile))
        self.measured: list[str] = []
        self.interrupt_at = interrupt_at
        self.needs_compile = needs_compile
        self.closed = False

    def device_facts(self):
        return self.inner.device_facts()

    def baselines(self, problem):
        return self.inner.baselines(problem)

    def measure(self, problem, variant, compiled, *, range_prefix=""):
        if self.interrupt_at is not None and len(self.measured) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.measured.append(variant.name)
        return self.inner.measure(problem, variant, compiled)

    def confirm(self, problem, variants, builts, rounds, **kwargs):
        return self.inner.confirm(problem, variants, builts, rounds, **kwargs)

    def close(self):
        self.closed = True


def options(recording, db_url: str, **changes) -> SearchOptions:
    base = SearchOptions(gpu=recording.profile, shapes=(shape_arg(recording.problem),),
                         dtype=recording.problem.dtype, causal=recording.problem.causal, backend="replay",
                         replay_from=recording.url, db_url=db_url, trials=30, seed=7)
    return replace(base, **changes)


def stored(db_url: str, **filt):
    with open_store(db_url) as store:
        return store.query_trials(TrialFilter(**filt))


def cli_search(rec, db_url: str, trials: int):
    """`tuner search` of the recording's problem with the replay backend, through the CLI."""
    args = ["--db", db_url, "search", "--gpu", rec.profile, "--shape", shape_arg(rec.problem), "--dtype",
            rec.problem.dtype, "--backend", "replay", "--from", rec.url, "--trials", str(trials), "--seed", "3"]
    return run_tuner(*args, *(["--causal"] if rec.problem.causal else []), env=WIDE)


def test_replay_search_end_to_end_via_the_cli(replay_recording, sqlite_url):
    rec = replay_recording
    result = cli_search(rec, sqlite_url, 40)
    assert result.exit_code == 0, result.stderr
    name = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    study = optuna.load_study(study_name=name, storage=storage_for(sqlite_url))
    assert finished_trials(study) == 40
    rows = stored(sqlite_url, study=name)
    reused = sum(1 for t in study.trials if t.user_attrs.get(ATTR_SOURCE) == "store" and not t.user_attrs.get(ATTR_REPEAT))
    infeasible = sum(1 for t in study.trials if t.user_attrs.get(ATTR_INFEASIBLE))
    repeats = sum(1 for t in study.trials if t.user_attrs.get(ATTR_REPEAT))
    assert infeasible > 0  # the recorded space has infeasible points: they are stored but not budgeted
    assert len(study.trials) == 40 + infeasible + repeats  # repeats of held points are free too
    assert len(rows) + reused == 40 + infeasible  # every trial stored once, except the ones served from the store
    assert {r.trial_number for r in rows} <= {t.number for t in study.trials}
    assert TrialStatus.OK in {r.status for r in rows} and TrialStatus.PRUNED in {r.status for r in rows}
    assert all(r.error for r in rows if r.status is TrialStatus.PRUNED)
    assert {r.gpu_name for r in rows} == {rec.gpu_name}  # the run says which card the numbers came from
    with open_store(sqlite_url) as store:
        run_id = rows[0].run_id
        assert store.baselines_for(run_id, store.problem_id(rec.problem))
    # The summary: best variant, its time and the ratio to the best baseline.
    best = min((r for r in rows if r.status is TrialStatus.OK), key=lambda r: r.median_us)
    assert short_variant(best.variant_name) in result.stdout  # the summary shows the tunables
    assert f"{best.median_us:.2f}" in result.stdout
    assert re.search(rf"{best.ratio_to_best_baseline:.2f}x", result.stdout)
    assert "search summary" in result.stdout
    shown = run_tuner("--db", sqlite_url, "results", "--best", "--format", "json")
    assert shown.exit_code == 0, shown.stderr
    assert best.variant_name in shown.stdout


def test_infeasible_points_are_never_compiled(replay_recording, sqlite_url):
    rec = replay_recording
    profile = load_profile(rec.profile)
    compiled: list[str] = []

    def fake_build(variant, arch):
        assert check(variant, rec.problem, profile).ok, f"compiled an infeasible variant {variant.name}"
        assert arch == profile.nvcc_arch
        compiled.append(variant.name)
        failed = variant.params["BLOCK_M"] == 32  # exercise the compile_error path too
        return built(variant, CompileResult(not failed, variant.name, arch, None, "" if failed else "ab" * 32, 96, 0,
                                            0, 0, 0.5, "error: synthetic failure" if failed else "ptxas info", False))

    backend = CountingBackend(rec, needs_compile=True)
    hooks = Hooks(make_backend=lambda *a, **k: backend, build=fake_build)
    report = run_search(options(rec, sqlite_url, sampler="random", trials=60), hooks=hooks)
    rows = stored(sqlite_url)
    pruned = [r for r in rows if r.status is TrialStatus.PRUNED and r.error != "not measured in the recording"]
    assert pruned, "the random sample should hit infeasible points"
    assert not {r.variant_name for r in pruned} & set(compiled)
    errors = [r for r in rows if r.status is TrialStatus.COMPILE_ERROR]
    assert all(r.params["BLOCK_M"] == 32 for r in errors)
    with open_store(sqlite_url) as store:
        for r in errors:
            assert "synthetic failure" in store.trial_detail(r.id).compile_log
    # A variant that failed to compile never reaches the backend.
    assert not {r.variant_name for r in errors} & set(backend.measured)
    assert set(backend.measured) <= set(compiled)
    assert backend.closed and report.asked == 60


def test_known_variants_are_served_from_the_store(replay_recording, sqlite_url):
    rec = replay_recording
    first = CountingBackend(rec)
    run_search(options(rec, sqlite_url, study="first", trials=40), hooks=with_backend(first))
    rows_before = stored(sqlite_url)
    second = CountingBackend(rec)
    report = run_search(options(rec, sqlite_url, study="second", trials=40, seed=11),
                        hooks=with_backend(second))
    measured_ok_first = {r.variant_name for r in rows_before if r.status is not TrialStatus.PRUNED}
    assert first.measured and second.measured
    assert not set(second.measured) & measured_ok_first, "re-measured a variant already in the store"
    assert report.reused >= 1  # the warm start alone brings back the first search's best variants
    rows = stored(sqlite_url)
    non_pruned = Counter((r.variant_name, r.template_hash) for r in rows if r.status is not TrialStatus.PRUNED)
    assert max(non_pruned.values()) == 1, "a variant was stored twice"
    study = optuna.load_study(study_name="second", storage=storage_for(sqlite_url))
    assert finished_trials(study) == 40


def test_warm_start_enqueues_the_best_variants_of_the_nearest_problem(replay_recording, sqlite_url):
    rec = replay_recording
    manifest = load_manifest("attn_fwd_mma")
    run_search(options(rec, sqlite_url, trials=40, confirm=0), hooks=with_backend(CountingBackend(rec)))
    ok = sorted((r for r in stored(sqlite_url, status="ok")), key=lambda r: r.median_us)
    top = []
    for r in ok:
        params = {k: v for k, v in r.params.items() if k in manifest.params}
        if params not in top:
            top.append(params)
    p = rec.problem
    near = Problem(p.batch * 2, p.heads, p.seq_q, p.seq_k, p.head_dim, dtype=p.dtype, causal=p.causal)
    with open_store(sqlite_url) as store:
        # A farther problem of the same head dim, with another winner, must not be chosen.
        far = replace(near, batch=p.batch * 64)
        run = store.start_run(RunInfo(gpu_name=rec.gpu_name, profile=rec.profile))
        decoy = {**top[-1], "head_dim": p.head_dim, "dtype": p.dtype, "causal": p.causal}
        store.add_trial(TrialRecord(run_id=run, problem=far, template="attn_fwd_mma",
                                    template_hash=manifest.source_hash, params=decoy, variant_name="decoy",
                                    status=TrialStatus.OK, timing=Timing(0.001)))
        warm = warm_start_points(store, rec.profile, "attn_fwd_mma", near, 3, manifest)
        assert warm.points == top[:3] and warm.sources == [f"the 3 best of {p.label}"]
        assert warm_start_points(store, "l4", "attn_fwd_mma", near, 3, manifest).points == []
    # The search over the near problem starts with those three points.
    run_search(options(rec, sqlite_url, shapes=(shape_arg(near),), trials=3),
               hooks=with_backend(CountingBackend(rec)))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", near), storage=storage_for(sqlite_url))
    # (The recording does not hold the near problem: its points are not measurable there, so free, and the
    # search stops after MAX_UNMEASURABLE_STREAK of them in a row.)
    assert [t.params for t in sorted(study.trials, key=lambda t: t.number)][:3] == top[:3]


class WarningBaselines(CountingBackend):
    """Baselines as the GPU worker returns them when FA4's compiler warned twice (written to the log)."""

    def baselines(self, problem):
        found = self.inner.baselines(problem)
        return [replace(found[0], warnings=2)] + found[1:]


def test_baseline_warnings_are_one_line_naming_the_log(replay_recording, sqlite_url, tmp_path, monkeypatch):
    rec = replay_recording
    monkeypatch.setenv("TUNER_LOG_DIR", str(tmp_path / "logs"))
    args = ["--db", sqlite_url, "search", "--gpu", rec.profile, "--shape", shape_arg(rec.problem), "--dtype",
            rec.problem.dtype, "--backend", "replay", "--from", rec.url, "--trials", "3", "--confirm", "0"]
    result = run_tuner(*args, *(["--causal"] if rec.problem.causal else []), env=WIDE,
                       hooks=with_backend(WarningBaselines(rec)))
    assert result.exit_code == 0, result.stderr
    impl = ReplayBackend(rec.url, load_profile(rec.profile)).baselines(rec.problem)[0].impl
    notes = [line for line in result.stderr.splitlines() if "baseline warnings" in line]
    assert notes == [f"{rec.problem.label}: baseline warnings ({impl} 2) written to "
                     f"{tmp_path / 'logs' / 'baselines.log'}"]


def test_ctrl_c_stores_everything_prints_the_summary_and_exits_130(replay_recording, sqlite_url):
    rec = replay_recording
    backend = CountingBackend(rec, interrupt_at=6)
    args = ["--db", sqlite_url, "search", "--gpu", rec.profile, "--shape", shape_arg(rec.problem), "--dtype",
            rec.problem.dtype, "--backend", "replay", "--from", rec.url, "--trials", "30", "--seed", "5"]
    if rec.problem.causal:
        args.append("--causal")
    result = run_tuner(*args, env=WIDE, hooks=with_backend(backend))
    assert result.exit_code == 130, result.stderr
    assert "search summary" in result.stdout and "interrupted" in result.stderr
    assert len(backend.measured) == 5 and backend.closed
    rows = stored(sqlite_url)
    measured_rows = [r for r in rows if r.status is not TrialStatus.PRUNED or r.error == "not measured in the recording"]
    assert sorted(r.variant_name for r in measured_rows) == sorted(backend.measured)
    with open_store(sqlite_url) as store:
        run = store.trial_detail(rows[0].id)
        assert run.run_ended_at is not None  # the run was finished properly
    # --resume finishes the budget without repeating a measured variant.
    again = run_tuner(*args, "--resume", env=WIDE, hooks=with_backend(CountingBackend(rec)))
    assert again.exit_code == 0, again.stderr
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    assert finished_trials(study) == 30
    non_pruned = Counter((r.variant_name, r.template_hash) for r in stored(sqlite_url) if r.status is not TrialStatus.PRUNED)
    assert max(non_pruned.values()) == 1


def test_an_existing_study_needs_resume(replay_recording, sqlite_url):
    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=3), hooks=with_backend(CountingBackend(rec)))
    with pytest.raises(TunerError, match="--resume"):
        run_search(options(rec, sqlite_url, trials=3), hooks=with_backend(CountingBackend(rec)))


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "gp", "grid"])
def test_every_sampler_runs_the_loop(replay_recording, sqlite_url, sampler):
    rec = replay_recording
    backend = CountingBackend(rec)
    report = run_search(options(rec, sqlite_url, sampler=sampler, trials=12), hooks=with_backend(backend))
    assert report.asked == 12 and report.summaries[0].trials == 12
    assert backend.measured  # some asked point was feasible and measured


def test_grid_budget_defaults_to_the_feasible_points(replay_recording, sqlite_url):
    # Infeasible points are not budgeted trials, so the grid's budget is its feasible part.
    from tuner.kernels.feasibility import feasible_space

    rec = replay_recording
    opts = options(rec, sqlite_url, sampler="grid", trials=None)
    manifest = load_manifest("attn_fwd_mma")
    profile = load_profile(rec.profile)
    with open_store(sqlite_url) as store:
        study, budget = prepare_study(opts, storage_for(sqlite_url), store, profile,
                                                  manifest, rec.problem, "grid-study")
    feasible = len(feasible_space("attn_fwd_mma", rec.problem, profile))
    product = math.prod(len(spec.values) for spec in manifest.params.values())
    assert 0 < budget == feasible == study.user_attrs[ATTR_BUDGET] < product


def test_failed_and_pruned_trials_are_told_to_optuna(replay_recording, sqlite_url):
    rec = replay_recording

    class Failing(CountingBackend):
        def measure(self, problem, variant, compiled, *, range_prefix=""):
            self.measured.append(variant.name)
            return Measurement(status=TrialStatus.LAUNCH_ERROR, error="illegal address (test)")

    run_search(options(rec, sqlite_url, sampler="random", trials=20), hooks=with_backend(Failing(rec)))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.FAIL] >= 1 and states[TrialState.COMPLETE] == 0
    assert finished_trials(study) == 20  # failures count; infeasible points (pruned, free) do not
    assert {r.status for r in stored(sqlite_url)} <= {TrialStatus.LAUNCH_ERROR, TrialStatus.PRUNED}


def test_gpu_backend_without_a_gpu_is_a_one_line_error(monkeypatch, sqlite_url):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for gpu in ("h100", "auto"):
        result = run_tuner("--db", sqlite_url, "search", "--gpu", gpu, "--shape", "1,8,512,64", "--trials", "2")
        assert result.exit_code not in (0, 130)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and "GPU" in lines[0], result.stderr
    assert not Path(sqlite_url[len("sqlite:///"):] + ".optuna.journal").exists()


def test_bad_options_are_one_line_errors(replay_recording, sqlite_url):
    rec = replay_recording
    base = ["--db", sqlite_url, "search", "--gpu", rec.profile, "--backend", "replay", "--from", rec.url]
    for extra, message in ((["--sampler", "bogus"], "unknown sampler"), (["--time-budget", "ten"], "malformed duration"),
                           (["--devices", "0,0"], "--devices"), ([ "--backend", "tpu"], "unknown backend"),
                           (["--shape", "1,8,512,48"], "head dim 48")):
        result = run_tuner(*base, *extra)
        assert result.exit_code == 2 and message in result.stderr, (extra, result.stderr)
    no_from = run_tuner("--db", sqlite_url, "search", "--gpu", "h100", "--backend", "replay")
    assert no_from.exit_code == 2 and "--from" in no_from.stderr


@pytest.mark.parametrize("devices", ["5", "1", "0,2"])
def test_replay_devices_are_worker_slots_from_0_not_cards(replay_recording, tmp_path, devices):
    """A replay measures on no card: --devices 5 is refused in one line (on any machine) before anything is
    written, rather than run as if card 5 measured it; 0,1,... set the number of replay workers."""
    rec = replay_recording
    db = tmp_path / "r.db"
    p = rec.problem
    result = run_tuner("--db", f"sqlite:///{db}", "search", "--gpu", rec.profile, "--backend", "replay",
                       "--from", rec.url, "--shape", f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}", "--trials", "2",
                       "--devices", devices)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: --devices {devices}: the replay backend uses no GPU")
    assert not db.exists()


def test_time_budget_stops_starting_trials(replay_recording, sqlite_url):
    rec = replay_recording
    ticks = iter(range(10_000))
    clock = lambda: 1_000_000.0 + next(ticks)  # one second per look at the clock  # noqa: E731
    report = run_search(options(rec, sqlite_url, trials=None, time_budget_s=20.0),
                        hooks=Hooks(make_backend=lambda *a, **k: CountingBackend(rec), now=clock))
    assert 0 < report.asked < 20


def test_a_search_on_the_card_measures_what_a_replay_of_its_name_answered(replay_recording, sqlite_url,
                                                                           monkeypatch):
    """The README's replay writes answers under the recording's card name into the store; a search on that card
    measures every point itself (none is taken from the replay), and a later replay still reuses its own."""
    import tuner.search.run as run

    rec = replay_recording
    replayed = run_search(options(rec, sqlite_url, trials=15, study="replayed", warm_start=0, template="attn_fwd_mma"))
    assert replayed.measured > 0
    monkeypatch.setattr(run, "require_gpus", lambda devices: None)  # a stand-in card: the replay's answers
    monkeypatch.setattr(run, "resolve_profile", lambda gpu, force=False, device=0: load_profile(rec.profile))
    card = CountingBackend(rec)
    on_card = run_search(options(rec, sqlite_url, trials=15, study="on-the-card", backend="gpu", replay_from=None,
                                 warm_start=0, template="attn_fwd_mma"), hooks=Hooks(make_backend=lambda *a, **k: card))
    assert on_card.reused == 0 and len(card.measured) >= on_card.measured > 0  # (unrecorded points: pruned)
    again = run_search(options(rec, sqlite_url, trials=15, study="replayed-again", warm_start=0,
                               template="attn_fwd_mma"))
    assert again.reused > 0


def test_a_study_started_with_a_time_budget_alone_resumes_only_with_a_budget(replay_recording, sqlite_url):
    """Its study holds no trial budget: a bare --resume would run without end, so it is refused (as `tuner
    worker` refuses it); --trials or --time-budget resume it."""
    rec = replay_recording
    ticks = iter(range(10_000))
    clock = lambda: 1_000_000.0 + next(ticks)  # noqa: E731
    hooks = Hooks(make_backend=lambda *a, **k: CountingBackend(rec), now=clock)
    first = run_search(options(rec, sqlite_url, trials=None, time_budget_s=10.0), hooks=hooks)
    with pytest.raises(TunerError, match="has no trial budget .* give --trials or --time-budget to resume it"):
        run_search(options(rec, sqlite_url, trials=None, resume=True), hooks=hooks)
    again = run_search(options(rec, sqlite_url, trials=first.asked + 3, resume=True), hooks=hooks)
    assert again.asked == 3


def test_a_study_interrupted_while_it_is_prepared_keeps_its_budget(replay_recording, sqlite_url, monkeypatch):
    """Ctrl-C during the warm start's queries: the study already holds its budget, so --resume runs to it."""
    import tuner.search.prepare as prepare

    rec = replay_recording

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(prepare, "warm_start_points", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_search(options(rec, sqlite_url, trials=7), hooks=Hooks(make_backend=lambda *a, **k: CountingBackend(rec)))
    report = run_search(options(rec, sqlite_url, trials=None, resume=True),
                        hooks=Hooks(make_backend=lambda *a, **k: CountingBackend(rec)))
    assert report.asked == 7


# --- review fixes: compile exceptions, `tuner worker` store, resume seeds, pool sizes, stop while waiting ---


def test_a_compile_that_raises_is_a_compile_error_and_the_search_goes_on(replay_recording, sqlite_url):
    rec = replay_recording

    def fake_build(variant, arch):
        if variant.params["BLOCK_M"] == 32:
            raise OSError("broken cache entry (test)")
        return built(variant, CompileResult(True, variant.name, arch, None, "ab" * 32, 96, 0, 0, 0, 0.5, "ptxas info"))

    backend = CountingBackend(rec, needs_compile=True)
    hooks = Hooks(make_backend=lambda *a, **k: backend, build=fake_build)
    report = run_search(options(rec, sqlite_url, sampler="random", trials=60), hooks=hooks)
    assert report.asked == 60
    errors = [r for r in stored(sqlite_url) if r.status is TrialStatus.COMPILE_ERROR]
    assert errors and all(r.params["BLOCK_M"] == 32 for r in errors)
    with open_store(sqlite_url) as store:
        assert all("OSError: broken cache entry (test)" in store.trial_detail(r.id).compile_log for r in errors)
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    by_number = {t.number: t for t in study.trials}
    assert all(by_number[r.trial_number].state == TrialState.FAIL for r in errors)
    assert finished_trials(study) == 60 and not {r.variant_name for r in errors} & set(backend.measured)


def test_worker_results_go_to_the_store_of_its_storage(replay_recording, sqlite_url, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=3), hooks=with_backend(CountingBackend(rec)))
    elsewhere = f"sqlite:///{tmp_path / 'default.db'}"
    monkeypatch.setenv("TUNER_DB", elsewhere)
    name = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    journal = sqlite_url[len("sqlite:///"):] + ".optuna.journal"
    for storage in (sqlite_url, journal):
        report = run_join([name], storage, backend="replay", replay_from=rec.url, trials=3,
                                     console=Console(file=io.StringIO()))
        with open_store(sqlite_url) as store:  # the worker's run (and its baselines) landed in x.db
            assert store.baselines_for(report.run_ids[0], store.problem_id(rec.problem))
    assert not (tmp_path / "default.db").exists()


def test_a_seeded_resume_asks_new_points(replay_recording, sqlite_url):
    rec = replay_recording
    first = options(rec, sqlite_url, sampler="random", trials=20, warm_start=0)
    run_search(first, hooks=with_backend(CountingBackend(rec)))
    report = run_search(replace(first, trials=40, resume=True), hooks=with_backend(CountingBackend(rec)))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    trials = [t for t in sorted(study.trials, key=lambda t: t.number) if counts_toward_budget(t)]
    old, new = [t.params for t in trials[:20]], [t.params for t in trials[20:]]
    assert len(new) == 20 and report.asked == 20
    # The same seed again would re-ask exactly the first run's points, all served from the store.
    assert not all(p in old for p in new)
    assert report.reused < report.asked


def test_worker_seeds_differ_per_worker_and_per_resume():
    from tuner.search.workers import worker_seed

    assert worker_seed(None, 1, 5) is None
    assert worker_seed(7, 0, 0) == 7  # a fresh study keeps its seed
    assert len({worker_seed(7, w, n) for w in range(4) for n in (0, 20, 40)}) == 12
    top = 2**32 - 1  # the largest --seed: its second worker, or a resume, stays a seed numpy takes
    assert all(0 <= worker_seed(top, w, n) < 2**32 for w in range(4) for n in (0, 20, 5000))
    assert len({worker_seed(top, w, n) for w in range(4) for n in (0, 20, 5000)}) == 12


def test_compile_pools_share_the_host_and_look_ahead_is_capped(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from tuner.search.job import MAX_LOOKAHEAD, lookahead_for
    from tuner.search.workers import compile_threads

    monkeypatch.setattr("os.cpu_count", lambda: 32)
    assert [compile_threads(n) for n in (1, 4, 64)] == [32, 8, 1]
    assert lookahead_for(None) == 1
    with ThreadPoolExecutor(max_workers=3) as small, ThreadPoolExecutor(max_workers=64) as big:
        assert lookahead_for(small) == 4 and lookahead_for(big) == MAX_LOOKAHEAD


def test_stop_while_waiting_for_a_duplicate_is_an_interrupted_trial(replay_recording, sqlite_url):
    import threading

    from tuner.kernels.variant import variant_from_params
    from tuner.search.in_hand import Pending
    from tuner.search.job import Context, WorkerJob
    from tuner.search.loop import ProblemSearch
    from tuner.search.samplers import distributions
    from tuner.search.study import ATTR_INTERRUPTED, load_study, study_info

    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=1, warm_start=0), hooks=with_backend(CountingBackend(rec)))
    name = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    study = load_study(storage_for(sqlite_url), name)
    info, profile = study_info(study), load_profile(rec.profile)
    dists = distributions(load_manifest(info.template))
    while True:  # a feasible point, being measured "by another worker" (running, all parameters set)
        other = study.ask(dists)
        variant = variant_from_params(info.template, info.problem, other.params)
        feasibility = check(variant, info.problem, profile)
        if feasibility.ok:
            break
        study.tell(other, state=TrialState.FAIL)
    study.enqueue_trial(other.params)
    mine = study.ask(dists)
    assert mine.params == other.params
    backend = CountingBackend(rec)
    stop = threading.Event()
    stop.set()
    with open_store(sqlite_url) as store:
        run_id = store.start_run(RunInfo(gpu_name=rec.gpu_name, profile=rec.profile))
        ctx = Context(store, backend, run_id, profile, rec.gpu_name, None, stop, lambda event: None)
        search = ProblemSearch(ctx, study, info, WorkerJob(0, name, 5))
        assert search._launch(Pending(mine, variant, feasibility, wait_for=other.number)) is None
    frozen = {t.number: t for t in study.get_trials()}[mine.number]
    assert backend.measured == []  # neither compiled nor measured
    assert frozen.state == TrialState.FAIL and frozen.user_attrs.get(ATTR_INTERRUPTED) == "waiting for a duplicate"
    study.tell(other, state=TrialState.FAIL)


def test_resume_without_template_continues_the_existing_studys_template(replay_recording, sqlite_url):
    # h200's first template is attn_fwd_wgmma; a study made with attn_fwd_mma must still be found by --resume.
    from tuner.search.prepare import choose_template

    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=5, template="attn_fwd_mma"), hooks=with_backend(CountingBackend(rec)))
    profile = load_profile(rec.profile)
    fresh = SearchOptions(gpu=rec.profile, shapes=(shape_arg(rec.problem),), dtype=rec.problem.dtype, db_url=sqlite_url)
    storage = storage_for(sqlite_url)
    assert choose_template(fresh, profile, storage) == "attn_fwd_wgmma"
    assert choose_template(replace(fresh, resume=True), profile, storage) == "attn_fwd_mma"
    named = study_name(rec.profile, "attn_fwd_mma", rec.problem)
    assert choose_template(replace(fresh, resume=True, study=named), profile, storage) == "attn_fwd_mma"


def test_the_bar_counts_what_the_budget_counts_and_a_first_run_reuses_nothing(replay_recording, sqlite_url):
    """Infeasible points are free: they never push the bar past --trials; a first search has nothing to reuse."""
    rec = replay_recording
    result = cli_search(rec, sqlite_url, 30)
    assert result.exit_code == 0, result.stderr
    shown = [int(done) for done, total in re.findall(r"(\d+)/(\d+)", result.stderr) if total == "30"]
    assert shown and max(shown) == 30, result.stderr
    assert "reused" not in result.stdout  # repeats within this search are said as such, not as reuse
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    assert any(t.user_attrs.get(ATTR_INFEASIBLE) for t in study.trials)  # there were free points to count wrong


# --- repeated proposals are free --------------------------------------------------------------


def test_trials_means_distinct_variants_repeats_are_free(replay_recording, sqlite_url):
    """--trials N buys N distinct variants: a point the study already holds is told from the store for free."""
    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=40, seed=11), hooks=with_backend(CountingBackend(rec)))
    study = optuna.load_study(study_name=study_name(rec.profile, "attn_fwd_mma", rec.problem),
                              storage=storage_for(sqlite_url))
    budgeted = [t for t in study.trials if counts_toward_budget(t)]
    assert len(budgeted) == 40 == finished_trials(study)
    assert len({tuple(sorted(t.params.items())) for t in budgeted}) == 40  # all distinct
    repeats = [t for t in study.trials if t.user_attrs.get(ATTR_REPEAT)]
    assert report.repeated == len(repeats)
    assert all(t.state == TrialState.COMPLETE or t.state == TrialState.FAIL for t in repeats)


class _TinySpaceBackend:
    """Answers every variant of the three-point attn_fault space (no GPU)."""

    needs_compile = False

    def device_facts(self):
        from tuner.backends.base import DeviceFacts

        return DeviceFacts("Fake GPU")

    def baselines(self, problem):
        return []

    def measure(self, problem, variant, built, *, range_prefix=""):
        return Measurement(TrialStatus.OK, Timing(10.0 + len(variant.params["MODE"]), 1.0, 1.0), rel_error=0.0)

    def confirm(self, problem, variants, builts, rounds, **kwargs):
        from tuner.backends.base import ConfirmTimings

        return ConfirmTimings({v.name: (10.0 + len(v.params["MODE"]),) * rounds for v in variants})

    def close(self):
        pass


def test_an_exhausted_space_stops_the_search_with_a_clear_line(sqlite_url, monkeypatch):
    from tuner.kernels import manifest, variant

    monkeypatch.setenv("TUNER_TEMPLATE_PATH", str(Path(__file__).parent / "data" / "kernel_templates"))
    manifest.load_manifest.cache_clear()
    variant._name_regex.cache_clear()
    try:
        args = ["--db", sqlite_url, "search", "--gpu", "h200", "--shape", "1,8,512,64", "--template", "attn_fault",
                "--backend", "replay", "--from", "sqlite:///unused.db", "--trials", "10", "--sampler", "random",
                "--seed", "1"]
        result = run_tuner(*args, env=WIDE, hooks=with_backend(_TinySpaceBackend()))
    finally:
        manifest.load_manifest.cache_clear()
        variant._name_regex.cache_clear()
    assert result.exit_code == 0, result.stderr
    assert "the space looks exhausted" in result.stderr
    study = optuna.load_study(study_name=study_name("h200", "attn_fault", Problem(1, 8, 512, 512, 64)),
                              storage=storage_for(sqlite_url))
    assert finished_trials(study) == 3  # the three points of the space, each measured once


class _PipelinedBackend(CountingBackend):
    """Takes measurements like the GPU backend does (submit now, reply later) and notes, at each submit,
    how many measured trials the store holds already."""

    def __init__(self, recording, db_url: str) -> None:
        super().__init__(recording)
        self.db_path, self.stored_at_submit = db_url[len("sqlite:///"):], []

    def submit_measure(self, problem, variant, built, *, range_prefix=""):
        import sqlite3

        with sqlite3.connect(self.db_path) as conn:
            self.stored_at_submit.append(conn.execute(
                "SELECT count(*) FROM trials WHERE status != 'pruned' OR error = ?", (NOT_RECORDED,)).fetchone()[0])
        return Measured(self.measure(problem, variant, built, range_prefix=range_prefix), 0.0)


def test_the_next_trial_goes_to_the_gpu_before_the_previous_one_is_stored(replay_recording, sqlite_url):
    """The parent stores and tells a trial, and asks the sampler, while the card measures the next one."""
    rec = replay_recording
    backend = _PipelinedBackend(rec, sqlite_url)
    report = run_search(options(rec, sqlite_url, trials=12, confirm=0), hooks=with_backend(backend))
    rows = stored(sqlite_url)
    sent = [r for r in rows if r.status is not TrialStatus.PRUNED or r.error == NOT_RECORDED]
    assert len(backend.measured) == len(sent) >= 10
    # The count says what was measured: points the recording lacks are sent but not measured.
    assert report.measured == len([r for r in rows if r.status is not TrialStatus.PRUNED]) >= 10
    assert backend.stored_at_submit == [max(i - 1, 0) for i in range(len(backend.measured))]


# --- the confirm stage ------------------------------------------------------------------------


def test_the_confirm_stage_re_times_the_best_and_stores_the_rounds(replay_recording, sqlite_url):
    from tuner.search.confirm import pick_winner

    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=30, confirm=4, confirm_rounds=5),
                        hooks=with_backend(CountingBackend(rec)))
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(rec.problem)
        assert confirmed is not None and confirmed.run_id in report.run_ids and confirmed.rounds == 5
        timings = store.confirm_timings(confirmed.confirmation_id)
    variants = [impl for impl in timings if impl.startswith("attn_")]
    assert len(variants) == 4 and {"sdpa_cudnn", "sdpa_flash"} <= set(timings)
    # The winner and the baseline it is measured against ran every round; clearly slower ones stopped
    # after round 1 (baselines) or round 3 (variants), keeping the rounds they ran.
    assert len(timings[confirmed.variant_name]) == len(timings[confirmed.baseline_impl]) == 5
    assert all(len(t) in (1, 3, 5) for t in timings.values())
    from tuner.backends.base import ConfirmTimings

    winner, ratio, baseline = pick_winner(ConfirmTimings({k: tuple(v) for k, v in timings.items()}), variants,
                                          [i for i in timings if i not in variants])
    assert (winner, baseline) == (confirmed.variant_name, confirmed.baseline_impl)
    assert ratio == pytest.approx(confirmed.ratio)
    [summary] = report.summaries
    assert summary.confirmed and summary.best_variant == confirmed.variant_name and summary.ratio == confirmed.ratio


def test_ctrl_c_during_the_confirm_stage_stores_no_confirmation_of_fewer_rounds(replay_recording, sqlite_url):
    import os
    import signal

    class CtrlCInConfirm(CountingBackend):
        def confirm(self, problem, variants, builts, rounds, **kwargs):
            timings = super().confirm(problem, variants, builts, rounds, **kwargs)
            os.kill(os.getpid(), signal.SIGINT)  # the user's first Ctrl-C: stop after this round
            return timings

    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=10, confirm=3, confirm_rounds=5),
                        hooks=with_backend(CtrlCInConfirm(rec)))
    assert report.interrupted
    with open_store(sqlite_url) as store:
        assert store.confirmed(rec.problem) is None
        assert len(store.query_trials(TrialFilter(problem=rec.problem))) >= 10  # the trials stay stored


def test_confirm_zero_turns_the_stage_off(replay_recording, sqlite_url):
    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=10, confirm=0), hooks=with_backend(CountingBackend(rec)))
    with open_store(sqlite_url) as store:
        assert store.confirmed(rec.problem) is None
    assert not report.summaries[0].confirmed


def test_the_winner_is_the_best_median_per_round_ratio_not_the_best_single_time():
    from tuner.backends.base import ConfirmTimings
    from tuner.search.confirm import pick_winner

    # "a" has the fastest single round, but loses in the per-round ratios that cancel the card's drift.
    timings = ConfirmTimings({"a": (80.0, 120.0, 121.0), "b": (99.0, 100.0, 101.0), "sdpa": (100.0, 102.0, 104.0)})
    winner, ratio, baseline = pick_winner(timings, ["a", "b"], ["sdpa"])
    assert (winner, baseline) == ("b", "sdpa") and ratio == pytest.approx(1.02)
    assert pick_winner(ConfirmTimings({"a": (2.0,), "b": (1.0,)}), ["a", "b"], []) == ("b", None, None)
    # A variant stopped early competes no more, whatever its first rounds said.
    stopped = ConfirmTimings({"a": (90.0, 90.0, 90.0), "b": (99.0, 99.0, 99.0, 99.0), "sdpa": (100.0,) * 4})
    assert pick_winner(stopped, ["a", "b"], ["sdpa"])[0] == "b"


def test_results_show_and_export_use_the_confirmed_figure(replay_recording, sqlite_url, tmp_path):
    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=30, confirm=4, confirm_rounds=3), hooks=with_backend(CountingBackend(rec)))
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(rec.problem)
    best = json.loads(run_tuner("--db", sqlite_url, "results", "--best", "--format", "json").stdout)
    [row] = [r for r in best if r["variant_name"] == confirmed.variant_name]
    assert row["confirmed_us"] == pytest.approx(confirmed.median_us) and row["confirmed_ratio"] == confirmed.ratio
    table = run_tuner("--db", sqlite_url, "results", "--best", env=WIDE).stdout
    assert f"{confirmed.ratio:.2f}x c" in table
    shown = run_tuner("--db", sqlite_url, "show", str(confirmed.trial_id), env=WIDE).stdout
    assert "confirmed: winner of the confirm stage" in shown
    assert json.loads(run_tuner("--db", sqlite_url, "show", str(confirmed.trial_id), "--format", "json").stdout
                      )["confirmed"]["rounds"] == 3


def test_tuner_confirm_confirms_stored_results(replay_recording, sqlite_url):
    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=20, confirm=0), hooks=with_backend(CountingBackend(rec)))
    result = run_tuner("--db", sqlite_url, "confirm", "--gpu", rec.profile, "--backend", "replay", "--from", rec.url,
                       "--confirm", "3", "--rounds", "4", env=WIDE)
    assert result.exit_code == 0, result.stderr
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(rec.problem)
        assert confirmed is not None and confirmed.rounds == 4
        assert len([i for i in store.confirm_timings(confirmed.confirmation_id) if i.startswith("attn_")]) == 3
    assert f"{rec.problem.label}: {confirmed.variant_name}" in result.stdout and "median of 4 rounds" in result.stdout


def test_results_mark_the_trials_a_replay_answered(replay_recording, sqlite_url):
    import csv
    import io

    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=10, confirm=0))
    table = run_tuner("--db", sqlite_url, "results", "--best", env=WIDE)
    assert table.exit_code == 0, table.stderr
    assert "r: answered from a recording (--backend replay), not measured" in table.stdout
    assert re.search(r"\d\.\d\dx r", table.stdout)
    rows = list(csv.DictReader(io.StringIO(run_tuner("--db", sqlite_url, "results", "--format", "csv").stdout)))
    assert rows and {r["replayed_from"] for r in rows} == {rec.url}


def test_a_replayed_confirm_stage_never_races_measured_trials(replay_recording, sqlite_url):
    """A replay reports the recording's card: its confirm stage re-times only trials answered from its
    recording, never the card's measured ones (their confirmation would carry replayed figures unmarked)."""
    import sqlite3

    rec = replay_recording
    run_search(options(rec, sqlite_url, trials=20, confirm=0), hooks=with_backend(CountingBackend(rec)))
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:  # as if measured on the card
        db.execute("UPDATE runs SET replayed_from = NULL")
    result = run_tuner("--db", sqlite_url, "confirm", "--gpu", rec.profile, "--backend", "replay", "--from", rec.url,
                       "--confirm", "3", "--rounds", "4", env=WIDE)
    assert result.exit_code == 0, result.stderr
    assert "nothing to confirm" in result.stdout + result.stderr
    with open_store(sqlite_url) as store:
        assert store.confirmed(rec.problem) is None


def test_warm_start_puts_confirmed_winners_of_near_problems_first_and_says_so(replay_recording, sqlite_url):
    rec = replay_recording
    manifest = load_manifest("attn_fwd_mma")
    run_search(options(rec, sqlite_url, trials=30, confirm=3, confirm_rounds=2), hooks=with_backend(CountingBackend(rec)))
    p = rec.problem
    near = Problem(p.batch * 2, p.heads, p.seq_q, p.seq_k, p.head_dim, dtype=p.dtype, causal=p.causal)
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(p)
        warm = warm_start_points(store, rec.profile, "attn_fwd_mma", near, 3, manifest)
        winner = {k: v for k, v in store.trial_detail(confirmed.trial_id).params.items() if k in manifest.params}
    assert warm.points[0] == winner and warm.sources[0] == f"the confirmed winner of {p.label}"
    # The recording holds `p` only (a replay of `near` from it is refused): its backend answers by variant.
    out = io.StringIO()
    run_search(options(rec, sqlite_url, shapes=(shape_arg(near),), trials=3, confirm=0),
               console=Console(file=out, width=250), hooks=with_backend(CountingBackend(rec)))
    assert f"{near.label}: warm start from the confirmed winner of {p.label}" in out.getvalue()



def test_the_search_says_where_its_wall_time_went(replay_recording, sqlite_url):
    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=10), hooks=with_backend(CountingBackend(rec)))
    phases = dict(report.seconds)
    assert {"start-up (worker, GPU context)", "baselines", "measuring (GPU worker)", "confirm stage"} <= set(phases)
    assert report.wall_s > 0 and sum(phases.values()) <= report.wall_s
    result = cli_search(rec, f"sqlite:///{Path(sqlite_url.removeprefix('sqlite:///')).with_name('t.db')}", 5)
    assert result.exit_code == 0 and "time: " in result.stdout and "s wall; " in result.stdout


def test_a_confirmation_a_faster_trial_came_after_is_stale(replay_recording, sqlite_url):
    """results --best shows the confirmed winner only while the best trial is one the stage re-timed."""
    rec = replay_recording
    report = run_search(options(rec, sqlite_url, trials=20, confirm=3, confirm_rounds=2),
                        hooks=with_backend(CountingBackend(rec)))
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(rec.problem)
        winner = store.trial_detail(confirmed.trial_id)
        [best] = store.prefer_confirmed(store.best_trials(TrialFilter(gpu=rec.profile)))
        assert best.confirmed_us is not None and best.id == confirmed.trial_id
        faster = store.add_trial(TrialRecord(
            run_id=report.run_ids[0], problem=rec.problem, template=winner.template, template_hash=winner.template_hash,
            params={**winner.params, "BLOCK_N": 999}, variant_name="later_and_faster", status=TrialStatus.OK,
            timing=Timing(0.5)))
        [best] = store.prefer_confirmed(store.best_trials(TrialFilter(gpu=rec.profile)))
    assert best.id == faster and best.confirmed_us is None


def test_an_old_journal_is_imported_by_one_process_only(tmp_path):
    from tuner.store import open_store as open_

    with open_(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert store.append_journal_if_empty(['{"op_code": 0}']) is True
        assert store.append_journal_if_empty(['{"op_code": 0}']) is False  # the second importer adds nothing
        assert len(store.journal_lines()) == 1
