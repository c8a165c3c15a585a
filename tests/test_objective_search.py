"""`tuner search --objective time|energy|isolated` on the replay backend: Optuna minimizes the objective's
figure, the confirm stage ranks by it, studies of different objectives stay apart, and a recording
without the figure is refused in one line."""

from __future__ import annotations

import statistics
from dataclasses import replace

import optuna
import pytest
from cli_helpers import run_tuner

from tuner.backends.synthetic import write_synthetic_recording
from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.samplers import study_name
from tuner.search.study import ATTR_SOURCE, ATTR_STORE_ID, storage_for, study_info
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

PROBLEM = Problem(1, 8, 512, 512, 64)
SHAPE = "1,8,512,64"


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("objective-recordings")
    urls = {"energy": f"sqlite:///{folder / 'energy.db'}", "none": f"sqlite:///{folder / 'none.db'}"}
    write_synthetic_recording(urls["energy"], [PROBLEM], isolated=True)
    write_synthetic_recording(urls["none"], [PROBLEM], energy=False)
    return urls


def options(url: str, db_url: str, **changes) -> SearchOptions:
    base = SearchOptions(gpu="h100", shapes=(SHAPE,), template="attn_fwd_mma", backend="replay", replay_from=url,
                         db_url=db_url, trials=40, seed=5, confirm=4, confirm_rounds=3)
    return replace(base, **changes)


def test_an_energy_search_minimizes_j_per_call_and_confirms_by_it(recordings, sqlite_url):
    report = run_search(options(recordings["energy"], sqlite_url, objective="energy"))
    name = study_name("h100", "attn_fwd_mma", PROBLEM, "energy")
    assert report.studies == [name] and name.endswith("-energy")
    study = optuna.load_study(study_name=name, storage=storage_for(sqlite_url))
    assert study_info(study).objective == "energy"
    with open_store(sqlite_url) as store:
        rows = {r.id: r for r in store.query_trials(TrialFilter(study=name, status=TrialStatus.OK))}
        told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert told and all(t.value == store.trial_detail(t.user_attrs[ATTR_STORE_ID]).energy.joules_per_call
                            for t in told)  # Optuna was told J per call, not µs
        by_joules = min(rows.values(), key=lambda r: r.energy.joules_per_call)
        by_us = min(rows.values(), key=lambda r: r.median_us)
        assert by_joules.id != by_us.id  # the two objectives pick different variants here
        assert store.trial_detail(study.best_trial.user_attrs[ATTR_STORE_ID]).variant_name == by_joules.variant_name
        confirmed = store.confirmed(PROBLEM)
        assert confirmed is not None and confirmed.objective == "energy"
        raced = store.confirm_energy(confirmed.confirmation_id)
        run = store.trial_detail(by_us.id).run
    # Each round replays the recorded figures: the winner is the best J per call of the race, and its ratio
    # the baseline's J over its own, not a ratio of µs.
    joules = {impl: statistics.median(e.joules_per_call for e in es) for impl, es in raced.items()}
    variants = [impl for impl in joules if impl.startswith("attn_fwd_mma_")]
    assert by_us.variant_name in variants  # the fastest back to back always races
    assert confirmed.variant_name == min(variants, key=joules.get)
    assert confirmed.joules_per_call == pytest.approx(joules[confirmed.variant_name])
    assert confirmed.ratio == pytest.approx(joules[confirmed.baseline_impl] / joules[confirmed.variant_name])
    assert run.objective == "energy"


def test_a_time_search_reads_energy_of_its_confirmed_winner_and_baseline_only(recordings, sqlite_url):
    """Metered blocks run 0.5 s: a time search's confirm stage meters none of its rounds, and after the race one
    block for the winner and one for its baseline (the energy pass), stored with the last round; the stored winner
    carries that figure, and no other candidate or baseline has one."""
    run_search(options(recordings["energy"], sqlite_url, confirm_rounds=4))
    with open_store(sqlite_url) as store:
        confirmed = store.confirmed(PROBLEM)
        assert confirmed is not None and confirmed.objective == "time"
        raced = store.confirm_energy(confirmed.confirmation_id)
        timed = store.confirm_timings(confirmed.confirmation_id)
    winner = raced[confirmed.variant_name]
    assert len(timed[confirmed.variant_name]) == 4 and len(winner) == 4
    assert list(winner[:3]) == [None] * 3
    assert winner[3] is not None and confirmed.joules_per_call == pytest.approx(winner[3].joules_per_call)
    assert confirmed.baseline_impl is not None and raced[confirmed.baseline_impl][3] is not None
    others = [impl for impl in raced if impl not in (confirmed.variant_name, confirmed.baseline_impl)]
    assert others and all(e is None for impl in others for e in raced[impl])  # before: all of the last round


def test_an_isolated_search_minimizes_the_isolated_times(recordings, sqlite_url):
    report = run_search(options(recordings["energy"], sqlite_url, objective="isolated", trials=20, confirm=0))
    study = optuna.load_study(study_name=report.studies[0], storage=storage_for(sqlite_url))
    with open_store(sqlite_url) as store:
        for t in study.trials:
            if t.state == optuna.trial.TrialState.COMPLETE:
                row = store.trial_detail(t.user_attrs[ATTR_STORE_ID])
                assert t.value == row.isolated_us and row.isolated_us != row.median_us


def test_studies_of_different_objectives_never_mix(recordings, sqlite_url):
    run_search(options(recordings["energy"], sqlite_url, trials=10, confirm=0))
    # The default names differ: an energy search starts its own study beside the time one.
    energy = run_search(options(recordings["energy"], sqlite_url, trials=10, confirm=0, objective="energy"))
    assert energy.studies == [study_name("h100", "attn_fwd_mma", PROBLEM, "energy")]
    # A study named by hand resumes only with its own objective.
    run_search(options(recordings["energy"], sqlite_url, trials=5, confirm=0, study="mine"))
    with pytest.raises(TunerError, match=r"^study 'mine' minimizes time, not energy; resume it with --objective time"):
        run_search(options(recordings["energy"], sqlite_url, trials=10, confirm=0, study="mine", resume=True,
                           objective="energy"))


def test_a_time_search_reuses_any_stored_trial_an_energy_search_only_those_with_energy(recordings, sqlite_url):
    """Trials stored without energy (a recording made without it, replayed into this store) answer a
    later time search of the same points, never an energy one: it measures them again."""
    first = run_search(options(recordings["none"], sqlite_url, trials=15, confirm=0, sampler="random"))
    assert first.measured > 0
    energy = run_search(options(recordings["energy"], sqlite_url, trials=15, confirm=0, sampler="random",
                                objective="energy"))
    again = run_search(options(recordings["energy"], sqlite_url, trials=15, confirm=0, sampler="random",
                               study="again"))
    assert again.reused > 0  # a time search takes whatever is stored
    with open_store(sqlite_url) as store:
        def told(name: str, source: str) -> list:
            study = optuna.load_study(study_name=name, storage=storage_for(sqlite_url))
            return [store.trial_detail(t.user_attrs[ATTR_STORE_ID]) for t in study.trials
                    if t.user_attrs.get(ATTR_SOURCE) == source]

        reused, measured = told(energy.studies[0], "store"), told(energy.studies[0], "measured")
        without = {r.variant_name for r in told(first.studies[0], "measured") if r.status is TrialStatus.OK}
    # Failures (incorrect) are reused whatever the objective; an ok trial only with its energy.
    assert all(r.status is not TrialStatus.OK or r.energy is not None for r in reused)
    assert {r.variant_name for r in measured if r.status is TrialStatus.OK} & without  # measured anew


def test_the_energy_objective_on_a_recording_without_energy_is_refused_in_one_line(recordings, sqlite_url):
    result = run_tuner("--db", sqlite_url, "search", "--gpu", "h100", "--shape", SHAPE, "--backend", "replay",
                       "--from", recordings["none"], "--trials", "5", "--objective", "energy")
    assert result.exit_code != 0
    [line] = result.stderr.strip().splitlines()
    assert "--objective energy: the recording" in line and "joules_per_call" in line
    with open_store(sqlite_url) as store:  # refused before any study or run was made
        assert store.query_trials(TrialFilter()) == []
    unknown = run_tuner("--db", sqlite_url, "search", "--gpu", "h100", "--shape", SHAPE, "--backend", "replay",
                        "--from", recordings["none"], "--objective", "watts")
    assert unknown.exit_code != 0 and "unknown objective 'watts'" in unknown.stderr


def test_a_worker_joining_a_study_minimizes_its_objective(recordings, sqlite_url):
    import io

    from rich.console import Console

    from tuner.search.run import run_join

    quiet = Console(file=io.StringIO())
    energy = run_search(options(recordings["energy"], sqlite_url, trials=5, confirm=0, objective="energy"),
                        console=quiet)
    plain = run_search(options(recordings["energy"], sqlite_url, trials=5, confirm=0), console=quiet)
    joined = run_join(energy.studies, sqlite_url, backend="replay", replay_from=recordings["energy"], trials=5,
                      console=quiet)
    assert joined.measured + joined.reused > 0
    study = optuna.load_study(study_name=energy.studies[0], storage=storage_for(sqlite_url))
    with open_store(sqlite_url) as store:
        mine = store.query_trials(TrialFilter(run_id=joined.run_ids[0]))
        assert mine and store.trial_detail(mine[0].id).run.objective == "energy"  # the joining worker's run says so
        assert all(t.value == store.trial_detail(t.user_attrs[ATTR_STORE_ID]).energy.joules_per_call
                   for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    with pytest.raises(TunerError, match="a worker minimizes one objective"):
        run_join(energy.studies + plain.studies, sqlite_url, backend="replay", replay_from=recordings["energy"],
                 trials=1, console=quiet)
