"""The first run a user makes (issue 38, item 4): `tuner search` with no --shape says how many problems it will
tune and how many trials each, gives the time left as problems finish, and holds --time-budget across the
problems, naming those it did not tune. On the replay backend, over a synthetic recording of some of the
h100 profile's default problems and other shapes."""

from __future__ import annotations

import io
import re

import pytest
from cli_helpers import run_tuner
from rich.console import Console

from tuner.backends.replay import ReplayBackend
from tuner.backends.synthetic import write_synthetic_recording
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.search.hooks import Hooks
from tuner.search.options import SearchOptions
from tuner.search.progress import SearchProgress
from tuner.search.run import run_search
from tuner.search.time_share import trial_deadline

PROFILE = "h100"


@pytest.fixture(scope="session")
def defaults_recording(tmp_path_factory) -> tuple[str, list, list]:
    """A synthetic recording of two of the h100 profile's default problems (its fp16 D256 ones: small spaces)
    and of three fp16 D256 shapes (the first a default too); the defaults and the shapes."""
    defaults = [p for p in load_profile(PROFILE).default_problems if p.head_dim == 256 and p.dtype == "fp16"]
    shapes = [Problem(b, 16, 2048, 2048, 256) for b in (8, 4, 2)]
    url = f"sqlite:///{tmp_path_factory.mktemp('defaults') / 'defaults.db'}"
    write_synthetic_recording(url, list(dict.fromkeys(defaults + shapes)), profile=PROFILE)
    return url, defaults, shapes


def shape_args(problems) -> list[str]:
    return [arg for p in problems for arg in ("--shape", f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}")]


def search_defaults(url: str, db: str, *extra: str):
    return run_tuner("--db", db, "search", "--gpu", PROFILE, "--backend", "replay", "--from", url, "--seed", "2",
                     *extra, env={"COLUMNS": "80"})


def test_a_search_of_the_default_problems_says_how_many_and_the_time_left_as_each_finishes(defaults_recording,
                                                                                           tmp_path) -> None:
    url, defaults, _shapes = defaults_recording
    result = search_defaults(url, f"sqlite:///{tmp_path / 'r.db'}", "--trials", "4", "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert f"tuning 2 problems (the {PROFILE} profile's defaults), 4 trials each" in lines
    done = [line for line in lines if re.match(r"\d/2 problems done in ", line)]
    assert [line.split()[0] for line in done] == ["1/2", "2/2"]
    assert re.search(r"; about (\d+ s|\d+m( \d+s)?) left$", done[0]), done
    assert "left" not in done[1]  # the last one says how long the whole run took
    new = [line for line in lines if line.startswith("tuning ") or line in done]
    assert all(len(line) <= 80 for line in new)


def test_a_search_of_given_shapes_says_nothing_of_defaults(defaults_recording, tmp_path) -> None:
    url, _defaults, shapes = defaults_recording
    result = search_defaults(url, f"sqlite:///{tmp_path / 'r.db'}", *shape_args(shapes[:1]), "--trials", "3",
                             "--confirm", "0")
    assert result.exit_code == 0, result.stderr
    assert "tuning " not in result.stderr and "problems done" not in result.stderr  # one problem: its bar says it


def tracking(clock: list[float], budget_s=None) -> SearchProgress:
    """A progress display of four problems on a fake clock."""
    progress = SearchProgress(Console(file=io.StringIO()), enabled=False, now=lambda: clock[0])
    for i in range(4):
        progress.add_problem(i, Problem(1, 8, 512 * (i + 1), 512 * (i + 1), 64), 10)
    progress.track_problems(4, budget_s)
    return progress


def test_the_time_left_follows_the_problems_done_within_the_budget() -> None:
    clock = [100.0]
    progress = tracking(clock)
    assert progress.eta_text() == "time left: after the first problem"
    clock[0] = 110.0
    progress.handle(("finished", 0))  # 10 s a problem: three left
    assert progress.eta_text() == "about 30 s left"
    clock[0] = 140.0
    progress.handle(("finished", 1))  # 20 s a problem now: two left
    assert progress.eta_text() == "about 40 s left"
    budgeted = tracking(clock, budget_s=30.0)
    assert budgeted.eta_text() == "at most 30 s left"
    clock[0] = 160.0
    budgeted.handle(("finished", 0))  # 20 s a problem would be 60 s more: the budget ends sooner
    assert budgeted.eta_text() == "about 10 s left"


def test_each_study_gets_the_time_left_over_the_studies_left_less_its_confirm_stage() -> None:
    assert trial_deadline(0.0, 30.0, 3) == 10.0
    assert trial_deadline(12.0, 30.0, 2) == 21.0  # the first overran: the others share what is left
    assert trial_deadline(12.0, 30.0, 2, confirm_s=4.0) == 17.0  # room for its confirm stage
    assert trial_deadline(12.0, 30.0, 2, confirm_s=8.0) == 16.5  # never less than half the share for trials
    assert trial_deadline(31.0, 30.0, 1) == 31.0


class PacedBackend(ReplayBackend):
    """The replay backend on a fake clock: a measurement takes 1 s, a confirm stage 4 s."""

    def __init__(self, url: str, clock: list[float]) -> None:
        super().__init__(url, load_profile(PROFILE))
        self.clock = clock

    def submit_measure(self, problem, variant, built, *, range_prefix=""):
        self.clock[0] += 1.0
        return super().submit_measure(problem, variant, built, range_prefix=range_prefix)

    def confirm(self, problem, variants, builts, rounds, **kwargs):
        if not kwargs.get("energy_pass"):  # a confirm stage's rounds take 4 s (its energy pass, 2 blocks: none)
            self.clock[0] += 4.0
        return super().confirm(problem, variants, builts, rounds, **kwargs)


def test_the_time_budget_holds_across_problems_and_names_those_it_left_out(defaults_recording, tmp_path) -> None:
    url, _defaults, problems = defaults_recording
    clock = [1000.0]
    backend = PacedBackend(url, clock)
    options = SearchOptions(gpu=PROFILE, shapes=tuple(f"{p.batch},{p.heads},{p.seq_q},{p.head_dim}" for p in problems),
                            backend="replay", replay_from=url, db_url=f"sqlite:///{tmp_path / 'r.db'}",
                            time_budget_s=9.0, seed=3, confirm=1, confirm_rounds=1, warm_start=0)
    out = io.StringIO()
    report = run_search(options, console=Console(file=out, width=80),
                        hooks=Hooks(make_backend=lambda *a, **k: backend, now=lambda: clock[0]))
    # The first problem: a third of 9 s of trials, then its confirm stage (4 s); the second: half of what is
    # left, less the confirm stage it is now expected to take (never under half its share); the budget is
    # then spent, so the third is not started.
    trials = {s.problem: s.trials for s in report.summaries}
    assert [trials[p] for p in problems] == [3, 1, 0]
    assert report.untuned == (report.studies[2],)
    assert clock[0] - 1000.0 <= 9.0 + 4.0  # at most the confirm stage of the problem in hand past the budget
    assert "time budget 9 s shared by 3 problems: each gets time left / problems left" in out.getvalue()
    assert not report.interrupted


def test_the_report_names_the_problems_the_budget_left_out(defaults_recording, tmp_path) -> None:
    url, _defaults, problems = defaults_recording
    clock = [1000.0]
    backend = PacedBackend(url, clock)
    result = run_tuner("--db", f"sqlite:///{tmp_path / 'r.db'}", "search", "--gpu", PROFILE, "--backend", "replay",
                       "--from", url, *shape_args(problems), "--seed", "3", "--time-budget", "9s", "--confirm", "1",
                       "--confirm-rounds", "1",
                       env={"COLUMNS": "80"}, hooks=Hooks(make_backend=lambda *a, **k: backend, now=lambda: clock[0]))
    assert result.exit_code == 0, result.stderr  # not an interruption: a clean stop
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("the time budget was spent"))
    said = " ".join(line.strip() for line in lines[at:at + 3])
    assert f"the time budget was spent: 1 of 3 problems not tuned: {problems[2].label}; continue with --resume" in said
    assert all(len(line) <= 80 for line in lines[at:at + 3])
