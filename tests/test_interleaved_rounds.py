"""interleaved_rounds: the one loop that times implementations against each other (confirm stage,
export --check, benchmarks): every call once a round, the first call of a round rotating."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.runtime.timing import Timing, interleaved_rounds


def test_each_call_runs_once_a_round_and_the_start_rotates() -> None:
    order: list[str] = []
    rounds_seen: list[int] = []

    def call(name: str, us: float):
        def run() -> Timing:
            order.append(name)
            return Timing(us, us, us, 1)
        return run

    times = interleaved_rounds({"a": call("a", 1.0), "b": call("b", 2.0), "c": call("c", 3.0)}, 4,
                               on_round=rounds_seen.append)
    assert times == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}
    assert [order[3 * r] for r in range(4)] == ["a", "b", "c", "a"]  # who goes first, round by round
    assert rounds_seen == [0, 1, 2, 3]


def test_nothing_to_time_runs_no_round() -> None:
    seen: list[int] = []
    assert interleaved_rounds({}, 5, on_round=seen.append) == {}
    assert seen == []


def _fixed(us: float):
    return lambda: Timing(us, us, us, 1)


def test_pruned_calls_stop_and_keep_the_rounds_they_ran() -> None:
    calls = {"a": _fixed(1.0), "b": _fixed(2.0), "c": _fixed(3.0)}
    times = interleaved_rounds(calls, 5, prune=lambda r, t: {"c"} if r == 1 else set())
    assert times == {"a": [1.0] * 5, "b": [2.0] * 5, "c": [3.0] * 2}


def test_the_confirm_pruner_stops_slow_baselines_after_one_round_and_slow_variants_after_three() -> None:
    from tuner.runtime.timing import confirm_pruner

    # v1 and v2 are within 2% of each other, v3 is 5% slower; sdpa_efficient is 30% slower than cuDNN.
    calls = {"v1": _fixed(100.0), "v2": _fixed(101.5), "v3": _fixed(105.0),
             "sdpa_cudnn": _fixed(100.0), "sdpa_flash": _fixed(104.0), "sdpa_efficient": _fixed(130.0)}
    prune = confirm_pruner(["v1", "v2", "v3"], ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient"])
    times = interleaved_rounds(calls, 7, prune=prune)
    assert {name: len(t) for name, t in times.items()} == {
        "v1": 7, "v2": 7, "v3": 3, "sdpa_cudnn": 7, "sdpa_flash": 7, "sdpa_efficient": 1}


def test_the_confirm_pruner_without_baselines_compares_median_times() -> None:
    from tuner.runtime.timing import confirm_pruner

    times = interleaved_rounds({"fast": _fixed(1.0), "slow": _fixed(1.1)}, 4, prune=confirm_pruner(["fast", "slow"], []))
    assert {name: len(t) for name, t in times.items()} == {"fast": 4, "slow": 3}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(50.0, 200.0), min_size=1, max_size=6), st.lists(st.floats(50.0, 200.0), max_size=3),
       st.integers(1, 9))
def test_the_leader_and_the_fastest_baseline_always_run_every_round(variant_us, baseline_us, rounds) -> None:
    from tuner.runtime.timing import confirm_pruner

    variants = [f"v{i}" for i in range(len(variant_us))]
    baselines = [f"b{i}" for i in range(len(baseline_us))]
    calls = {n: _fixed(us) for n, us in zip(variants + baselines, variant_us + baseline_us)}
    times = interleaved_rounds(calls, rounds, prune=confirm_pruner(variants, baselines))
    fastest_variant = variants[variant_us.index(min(variant_us))]
    assert len(times[fastest_variant]) == rounds
    if baselines:
        assert len(times[baselines[baseline_us.index(min(baseline_us))]]) == rounds
    assert all(1 <= len(t) <= rounds for t in times.values())


def test_the_fastest_sdpa_backend_keeps_running_when_fa4_is_far_ahead() -> None:
    """An export routes a cell by its kernel's per-round ratio to the fastest SDPA backend: that one must
    have every round even when another baseline (FlashAttention-4) is more than 10% faster."""
    from tuner.runtime.timing import confirm_pruner

    calls = {"v": _fixed(90.0), "fa4": _fixed(80.0), "sdpa_cudnn": _fixed(100.0), "sdpa_flash": _fixed(120.0)}
    prune = confirm_pruner(["v"], ["fa4", "sdpa_cudnn", "sdpa_flash"], keep_fastest_of={"sdpa_cudnn", "sdpa_flash"})
    times = interleaved_rounds(calls, 5, prune=prune)
    assert {name: len(t) for name, t in times.items()} == {"v": 5, "fa4": 5, "sdpa_cudnn": 5, "sdpa_flash": 1}


def test_a_pruner_that_stops_everything_ends_the_rounds() -> None:
    times = interleaved_rounds({"a": _fixed(1.0)}, 4, prune=lambda r, t: set(t))
    assert times == {"a": [1.0]}
