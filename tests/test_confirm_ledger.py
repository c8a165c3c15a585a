"""The confirm stage's rounds shared by several cards: the ledger, pruning on pooled rounds, pooling."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.runtime.baselines import confirm_stage_pruner
from tuner.search.confirm import in_every_round, pick_winner, pooled_timings, stopped_early
from tuner.search.confirm_ledger import Ledger, MemoryAttributes, Plan, await_plan, current_plan, publish


def plan(rounds: int = 7, created: float = 100.0, done: bool = False) -> Plan:
    return Plan(id="p1", gpu="NVIDIA H100 80GB HBM3", template="attn_fwd_mma",
                variants=(("v1", {"BLOCK_M": 64}), ("v2", {"BLOCK_M": 128})), rounds=rounds, created=created, done=done)


def test_a_plan_survives_its_json_form():
    attrs = MemoryAttributes()
    publish(attrs, plan())
    assert current_plan(attrs) == plan()


@given(rounds=st.integers(1, 12), cards=st.integers(1, 4), order=st.lists(st.integers(0, 3), min_size=60, max_size=60))
def test_cards_sharing_a_plan_start_exactly_its_rounds_when_they_take_turns(rounds, cards, order):
    attrs = MemoryAttributes()
    ledgers = [Ledger(attrs, plan(rounds), f"card{i}") for i in range(cards)]
    started = []
    for i in order:
        number = ledgers[i % cards].begin_round()
        if number is not None:
            started.append(number)
            ledgers[i % cards].record(number, {"v1": 1.0, "sdpa_cudnn": 1.1})
    started += [n for n in (ledger.begin_round() for ledger in ledgers for _ in range(rounds)) if n is not None]
    assert sorted(started) == list(range(rounds))  # each round number once: the start order keeps rotating


def test_two_cards_starting_the_last_round_at_once_time_one_round_more():
    attrs = MemoryAttributes()
    a, b = Ledger(attrs, plan(3), "a"), Ledger(attrs, plan(3), "b")
    assert (a.begin_round(), b.begin_round()) == (0, 1)
    # a and b both read "2 started" before either writes: both start round 2
    a.started, b.started = a.started + 1, b.started + 1
    a._write(), b._write()
    assert a.begin_round() is None and b.begin_round() is None
    for number, ledger in enumerate((a, b, a, b)):
        ledger.record(number, {"v1": 1.0})
    assert len(a.rounds()) == 4 and a.participants() == 2


def test_pooled_rounds_come_in_the_order_they_started_and_wait_for_rounds_still_running():
    attrs = MemoryAttributes()
    a, b = Ledger(attrs, plan(2), "a"), Ledger(attrs, plan(2), "b")
    first, second = a.begin_round(), b.begin_round()
    b.record(second, {"v1": 2.0})  # round 1 finishes first
    assert b.leading_rounds() == []  # decisions wait for round 0

    def late() -> None:
        time.sleep(0.3)
        a.record(first, {"v1": 1.0})

    threading.Thread(target=late).start()
    started = time.monotonic()
    rounds = b.wait_settled(threading.Event())
    assert time.monotonic() - started >= 0.25
    assert rounds == [{"v1": 1.0}, {"v1": 2.0}] == b.leading_rounds()


def test_a_participant_that_falls_silent_mid_round_is_not_waited_for_forever():
    attrs = MemoryAttributes()
    a, b = Ledger(attrs, plan(2), "a"), Ledger(attrs, plan(2), "b")
    a.record(a.begin_round(), {"v1": 1.0})
    b.begin_round()  # b was killed in its round
    started = time.monotonic()
    assert a.wait_settled(threading.Event(), quiet_s=0.2) == [{"v1": 1.0}]
    assert time.monotonic() - started < 2


def test_a_helper_joins_only_an_open_plan_published_since_it_started():
    attrs, stop = MemoryAttributes(), threading.Event()
    publish(attrs, plan(created=50.0))  # an earlier search's plan, left open
    assert await_plan(attrs, since=100.0, stop=stop, wait_s=0.1) is None
    publish(attrs, plan(created=150.0, done=True))
    assert await_plan(attrs, since=100.0, stop=stop, wait_s=0.1) is None
    publish(attrs, plan(created=150.0))
    assert await_plan(attrs, since=100.0, stop=stop, wait_s=0.1) == plan(created=150.0)


def test_a_helper_waits_for_the_plan_and_stops_waiting_on_ctrl_c():
    attrs, stop = MemoryAttributes(), threading.Event()
    threading.Timer(0.2, lambda: publish(attrs, plan(created=150.0))).start()
    assert await_plan(attrs, since=100.0, stop=stop, wait_s=5) == plan(created=150.0)
    stop.set()
    started = time.monotonic()
    assert await_plan(MemoryAttributes(), since=0.0, stop=stop, wait_s=5) is None
    assert time.monotonic() - started < 1


def test_pruning_on_pooled_rounds_is_the_confirm_stage_pruner_on_them():
    variants = ["fast", "close", "slow"]
    rounds = [{"fast": 100.0, "close": 101.0, "slow": 110.0, "sdpa_cudnn": 105.0, "sdpa_math": 400.0}
              for _ in range(3)]
    assert stopped_early([], variants) == set()
    assert stopped_early(rounds[:1], variants) == {"sdpa_math"}  # a clearly slower baseline, after one round
    assert stopped_early(rounds, variants) == {"sdpa_math", "slow"}  # a clearly slower variant, after three
    prune = confirm_stage_pruner(variants, rounds[0])
    assert set(prune(2, {k: [r[k] for r in rounds] for k in rounds[0] if k != "sdpa_math"})) == {"slow"}


def test_pooled_timings_align_the_implementations_timed_in_every_round():
    timings = pooled_timings([{"v": 1.0, "b": 2.0, "x": 9.0}, {"v": 1.1, "b": 2.1}, {"v": 1.2, "b": 2.2}])
    assert timings.rounds == {"v": (1.0, 1.1, 1.2), "b": (2.0, 2.1, 2.2), "x": (9.0,)}


@pytest.mark.parametrize("first_round", [0, 1, 2, 5])
def test_interleaved_rounds_numbered_from_first_round_rotate_as_one_long_run(first_round):
    from tuner.runtime.timing import Timing, interleaved_rounds

    seen: list[str] = []

    def call(name: str):
        return lambda: (seen.append(name), Timing(1.0, 1.0, 1.0, 1))[1]

    interleaved_rounds({"a": call("a"), "b": call("b"), "c": call("c")}, 1, first_round=first_round)
    assert seen[0] == "abc"[first_round % 3]


def test_only_implementations_timed_in_every_pooled_round_can_win():
    # A card skipped "fast" in round 1 (it failed its check on fresh inputs there): its two timings would
    # pair with the baseline's rounds 0 and 1, not 0 and 2, so it may not win however fast it looks.
    rounds = [{"fast": 50.0, "steady": 100.0, "base": 110.0}, {"steady": 101.0, "base": 111.0},
              {"fast": 50.0, "steady": 100.0, "base": 110.0}]
    assert set(in_every_round(rounds).rounds) == {"steady", "base"}
    winner, ratio, baseline = pick_winner(in_every_round(rounds), ["fast", "steady"], ["base"])
    assert (winner, baseline) == ("steady", "base") and ratio == pytest.approx(1.1, rel=1e-3)
    assert pick_winner(in_every_round(rounds[:1] + rounds[1:2]), ["fast"], ["base"])[0] is None


def test_a_round_a_card_failed_is_given_back_and_a_closed_plan_starts_no_more():
    attrs = MemoryAttributes()
    publish(attrs, plan(2))
    a, b = Ledger(attrs, plan(2), "a"), Ledger(attrs, plan(2), "b")
    assert (a.begin_round(), b.begin_round()) == (0, 1)
    b.release()  # b's card failed in its round
    assert a.begin_round() == 1  # a takes it
    a.record(0, {"v1": 1.0}), a.record(1, {"v1": 1.0})
    assert a.wait_settled(threading.Event(), quiet_s=0.2) == [{"v1": 1.0}, {"v1": 1.0}] and a.missing() == 0
    c = Ledger(attrs, plan(5), "c")
    publish(attrs, plan(5, done=True))
    assert c.begin_round() is None


def test_a_plan_of_another_release_is_ignored_and_only_its_owner_closes_a_plan():
    from tuner.search.confirm_ledger import PLAN_KEY, finish

    attrs = MemoryAttributes()
    attrs.write(PLAN_KEY, {"id": "x", "something_new": 1})
    assert current_plan(attrs) is None
    publish(attrs, plan())
    other = Plan(**{**plan().__dict__, "id": "p2"})
    finish(attrs, other)  # not the current plan: left open
    assert current_plan(attrs) == plan()
    finish(attrs, plan())
    assert current_plan(attrs).done



def test_an_energy_stage_keeps_a_baseline_whose_first_round_had_no_energy_reading() -> None:
    """--objective energy: round 0's joules of cuDNN were not read (NVML saw too few counter steps); later rounds
    still time it, so the winner is compared with the best baseline, not the next one."""
    import threading
    from types import SimpleNamespace as NS

    from tuner.backends.base import ConfirmTimings
    from tuner.runtime.energy import Energy
    from tuner.runtime.objective import ENERGY
    from tuner.search.confirm import ROUND_FIGURE, comparable_rounds, take_rounds

    joules = {"v1": 0.050, "sdpa_cudnn": 0.055, "sdpa_flash": 0.070}
    asked = []

    def confirm(problem, variants, builts, rounds, baselines=None, first_round=0, energy_pass=False):
        names = [v.name for v in variants] + (list(joules)[1:] if baselines is None else baselines)
        asked.append(names)
        energy = {n: (None if (n == "sdpa_cudnn" and first_round == 0) else Energy(joules[n], 700.0, 1500.0),)
                  for n in names}
        return ConfirmTimings({n: (joules[n] / 700 * 1e6,) for n in names}, energy)

    ctx = NS(backend=NS(confirm=confirm, needs_compile=False), stop=threading.Event(), objective=ENERGY, hooks=None,
             profile=NS(nvcc_arch="sm_90"))
    ledger = Ledger(MemoryAttributes(), Plan("p", "H100", "t", (("v1", {}),), 7, 0.0), "me")
    take_rounds(ctx, ledger, None, [NS(name="v1")])
    assert all("sdpa_cudnn" in names for names in asked)
    figures = ledger.pooled()
    complete = in_every_round(comparable_rounds(figures[ROUND_FIGURE["time"]], figures[ROUND_FIGURE[ENERGY]]))
    winner, ratio, baseline = pick_winner(complete, ["v1"], [b for b in complete.rounds if b != "v1"])
    assert (winner, baseline) == ("v1", "sdpa_cudnn") and ratio == pytest.approx(0.055 / 0.050)
