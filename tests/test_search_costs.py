"""The search's own costs (issue 38, item 2), on the replay backend: the worker's asking and storing are named in the
time breakdown apart from the wait for the card, and a point the sampler proposes again is answered without a
second query of the store."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.backends.replay import DELAY_ENV, ReplayBackend
from tuner.backends.synthetic import write_synthetic_recording
from tuner.kernels.compiler import CompileResult
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import BuiltKernel, launch_shape
from tuner.search import nudge
from tuner.search.hooks import Hooks
from tuner.search.answers import KnownAnswers
from tuner.search.job import ASKING, MEASURING, STORING
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.samplers import study_name
from tuner.search.study import load_study, opened_storage
from tuner.search.loop import ProblemSearch

DECODE = Problem(8, 28, 1, 8192, 128, dtype="bf16", causal=True, heads_kv=4)
DECODE4 = Problem(8, 28, 4, 8192, 128, dtype="bf16", causal=True, heads_kv=4)  # four query rows: speculative decoding


class _Point:
    """What KnownAnswers reads of a variant: its parameters."""

    def __init__(self, **params) -> None:
        self.params = params

    def stored_params(self) -> dict:
        return dict(self.params)


def test_a_found_answer_is_looked_up_once_and_a_missing_one_each_time() -> None:
    a, b = _Point(BLOCK_M=64, STAGES=2), _Point(BLOCK_M=128, STAGES=2)
    asked: list[int] = []
    rows = {64: "row of a"}

    def lookup(variant):
        asked.append(variant.params["BLOCK_M"])
        return rows.get(variant.params["BLOCK_M"])

    known = KnownAnswers(lookup, lambda: set())
    assert [known(a), known(_Point(STAGES=2, BLOCK_M=64)), known(b), known(b)] == ["row of a", "row of a", None, None]
    assert asked == [64, 128, 128] and known.queries == 3
    rows[128] = "row of b"  # stored meanwhile (another worker): found on the next proposal, then kept
    assert known(b) == "row of b" and known(b) == "row of b" and known.queries == 4


def test_a_point_the_study_does_not_hold_is_looked_up_only_when_an_earlier_run_stored_it() -> None:
    from tuner.store import canonical_json

    a, b = _Point(BLOCK_M=64, STAGES=2), _Point(BLOCK_M=128, STAGES=2)
    asked: list[int] = []
    listed: list[int] = []

    def lookup(variant):
        asked.append(variant.params["BLOCK_M"])
        return "row of a" if variant.params["BLOCK_M"] == 64 else None

    def stored_keys():
        listed.append(1)
        return {canonical_json(a.stored_params())}

    known = KnownAnswers(lookup, stored_keys)
    assert [known.earlier(b), known.earlier(a), known.earlier(a), known.earlier(b)] == [None, "row of a", "row of a", None]
    assert listed == [1] and asked == [64]  # one listing; b, stored by no earlier run, is never queried


@pytest.fixture(scope="module")
def decode_recording(tmp_path_factory) -> str:
    """Every feasible variant of a decode problem on the h200 profile (~150: a small space, as decode's are)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('decode') / 'synthetic.db'}"
    write_synthetic_recording(url, [DECODE, DECODE4], profile="h200", template="attn_decode", gpu_name="NVIDIA H200")
    return url


def decode_search(recording: str, db_url: str, **changes) -> SearchOptions:
    """A replayed search of DECODE (no confirm stage unless asked)."""
    base = SearchOptions(gpu="h200", shapes=("8,28,1,8192,128",), heads_kv=4, dtype="bf16", causal=True,
                         backend="replay", replay_from=recording, db_url=db_url, seed=3, confirm=0)
    return replace(base, **changes)


def test_repeated_proposals_are_answered_without_a_query_each(decode_recording, sqlite_url, monkeypatch) -> None:
    found: list[str] = []
    real = ProblemSearch._find

    def counting(self, variant):
        found.append(variant.name)
        return real(self, variant)

    monkeypatch.setattr(ProblemSearch, "_find", counting)
    monkeypatch.setattr(nudge, "IDLE_NUDGE", 0)  # the idle nudge would answer most repeats with a new point
    # Two thirds of the space, drawn at random: the sampler proposes points it holds often near the end.
    report = run_search(decode_search(decode_recording, sqlite_url, trials=100, sampler="random"))
    assert report.repeated > report.measured // 2, "the test needs a search whose sampler proposes held points often"
    # A new point is not queried (no earlier run stored it: KnownAnswers.earlier); a repeated one once, at its
    # first repeat (found, then kept); before, one query per distinct point and one per repeat.
    assert 0 < len(set(found)) <= report.measured
    assert len(found) <= 2 * len(set(found)) and len(found) < report.repeated


def test_the_breakdown_names_the_asking_and_storing_apart_from_the_wait_for_the_card(decode_recording, sqlite_url,
                                                                                     monkeypatch) -> None:
    delay, trials = 0.15, 6
    monkeypatch.setenv(DELAY_ENV, str(delay))  # each measurement keeps the "card" busy this long
    report = run_search(decode_search(decode_recording, sqlite_url, trials=trials, sampler="random"))
    phases = dict(report.seconds)
    assert {ASKING, STORING, MEASURING} <= set(phases)
    assert report.measured == trials  # every feasible point is recorded: each submitted one is measured
    # The card's time less what the worker did meanwhile: never more than the card's time (before, the worker's
    # asking and storing while the card measured were counted as measuring too).
    assert phases[MEASURING] <= trials * delay + 0.05
    assert phases[MEASURING] + phases[ASKING] + phases[STORING] >= trials * delay - 0.05
    assert sum(phases.values()) <= report.wall_s


class _Confirming(ReplayBackend):
    """The replay backend, compiling (so that a search asks ahead with a pool), that counts at each confirm stage
    the trials of the next problem's study (its points asked ahead)."""

    needs_compile = True

    def __init__(self, url: str, db_url: str) -> None:
        super().__init__(url, load_profile("h200"))
        self.db_url = db_url
        self.next_held: list[int] = []

    def confirm(self, problem, variants, builts, rounds, **kwargs):
        if problem == DECODE:
            with opened_storage(self.db_url) as storage:
                study = load_study(storage, study_name("h200", "attn_decode", DECODE4))
                self.next_held.append(len(study.get_trials(deepcopy=False)))
        return super().confirm(problem, variants, builts, rounds, **kwargs)


def test_the_next_study_asks_its_first_points_before_the_confirm_stage_of_the_one_before(decode_recording,
                                                                                         sqlite_url) -> None:
    def fake_build(variant, arch):
        return BuiltKernel(variant, "", CompileResult(True, variant.name, arch, None, "ab" * 32, 96, 0, 0, 0, 0.5,
                                                      "ptxas info"), launch_shape(variant))

    backend = _Confirming(decode_recording, sqlite_url)
    options = decode_search(decode_recording, sqlite_url, trials=4, sampler="random", confirm=2, confirm_rounds=2,
                            shapes=("8,28,1,8192,128", "8,28,4,8192,128"))
    report = run_search(options, hooks=Hooks(make_backend=lambda *a, **k: backend, build=fake_build))
    assert report.measured == 8 and len(report.summaries) == 2
    # As the first problem's confirm stage began, the second's study held the points it asked ahead (their
    # compiles running under the confirm rounds); before, it was started after the confirm stage.
    assert backend.next_held and backend.next_held[0] >= 1

