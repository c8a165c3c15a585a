"""interleaved_rounds: the one loop that times implementations against each other (confirm stage,
export --check, benchmarks): every call once a round, the first call of a round rotating."""

from __future__ import annotations

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
