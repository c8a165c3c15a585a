"""The rounds of one confirm stage, shared by the cards that end a study together.

The worker that confirms a study publishes a plan (the candidates, the rounds R,
the card model); every worker of the search that has nothing left to measure
joins it. Each participant starts one round at a time until R have been started
(so N cards finish the stage in about 1/N of the time), and records each round's
timings as soon as it has them. The confirming worker then waits for the rounds
still running elsewhere and pools them. Every round is timed on one card in one
process, so each per-round ratio stays a same-card, same-process figure; the
winner's figure is the median of those ratios over all pooled rounds.

The ledger lives in the study's user attributes, the storage every worker of the
study already shares: one key for the plan, one per participant for its rounds.
Each participant writes only its own key, so there is no write race; two cards
starting the last round at once time one round more than R, which costs little
and is kept.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Optional, Protocol

PLAN_KEY = "confirm_plan"
SHARE_PREFIX = "confirm_share:"
# What a round records of each implementation: µs back to back, J per call, W, SM MHz, isolated µs.
FIGURES = ("us", "j", "w", "mhz", "iso")
QUIET_S = 60.0  # a participant silent this long while holding a started round is taken as gone
POLL_S = 0.05


class Attributes(Protocol):
    """Where a ledger lives: read all keys, write one."""

    def read(self) -> dict[str, Any]: ...

    def write(self, key: str, value: Any) -> None: ...


class StudyAttributes:
    """A study's user attributes (shared by every worker on the study)."""

    def __init__(self, study: Any) -> None:
        self.study = study

    def read(self) -> dict[str, Any]:
        return self.study.user_attrs

    def write(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, value)


class MemoryAttributes:
    """A ledger for one participant (`tuner confirm`): nothing to share."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        return dict(self.values)

    def write(self, key: str, value: Any) -> None:
        self.values[key] = value


@dataclass(frozen=True)
class Plan:
    """What a confirm stage re-times: the same candidates on every participating card."""

    id: str
    gpu: str  # rounds of other card models are not pooled: their figures do not compare
    template: str
    variants: tuple[tuple[str, dict[str, Any]], ...]  # (variant name, stored parameters)
    rounds: int
    created: float  # time.time() at publication: a helper ignores plans older than itself
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "variants": [list(v) for v in self.variants]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Plan":
        return cls(**{**data, "variants": tuple((name, params) for name, params in data["variants"])})


def publish(attrs: Attributes, plan: Plan) -> None:
    attrs.write(PLAN_KEY, plan.to_json())


def current_plan(attrs: Attributes) -> Optional[Plan]:
    """The study's latest plan (None: none, or one this version cannot read, e.g. from another release)."""
    return _plan_of(attrs.read())


def _plan_of(values: dict[str, Any]) -> Optional[Plan]:
    data = values.get(PLAN_KEY)
    try:
        return Plan.from_json(data) if isinstance(data, dict) else None
    except (TypeError, KeyError, ValueError):
        return None


def finish(attrs: Attributes, plan: Plan) -> None:
    """Mark `plan` done, unless another plan has replaced it since (another worker's stage, left open)."""
    current = current_plan(attrs)
    if current is None or current.id == plan.id:
        publish(attrs, dataclasses.replace(plan, done=True))


def await_plan(attrs: Attributes, since: float, stop: Any, wait_s: float) -> Optional[Plan]:
    """The open plan published at or after `since`, waited for at most `wait_s` (None: none came,
    or the one published is finished already)."""
    deadline = time.monotonic() + wait_s
    while not stop.is_set():
        plan = current_plan(attrs)
        if plan is not None and plan.created >= since:
            return None if plan.done else plan
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)
    return None


class Ledger:
    """One participant's view of a plan's rounds. Rounds are numbered in the order they are started;
    pooled rounds come in that order, so an implementation stopped early has timed a prefix of them."""

    def __init__(self, attrs: Attributes, plan: Plan, me: str) -> None:
        self.attrs, self.plan = attrs, plan
        self.key = f"{SHARE_PREFIX}{plan.id}:{me}"
        self.started = 0
        self.mine: list[dict[str, Any]] = []

    def _read(self) -> tuple[list[dict[str, Any]], bool]:
        """Every participant's share, and whether the plan was closed (its confirming worker gave up)."""
        values = self.attrs.read()
        prefix = f"{SHARE_PREFIX}{self.plan.id}:"
        shares = [value for key, value in sorted(values.items()) if key.startswith(prefix)]
        current = _plan_of(values)
        return shares, current is not None and current.id == self.plan.id and current.done

    def _write(self) -> None:
        self.attrs.write(self.key, {"started": self.started, "rounds": self.mine})

    def begin_round(self, extra: bool = False) -> Optional[int]:
        """Start a round (its number, which also rotates the order of its timings), or None when the
        plan's rounds are all started or the plan is closed; `extra`: start one whatever the count (the
        confirming worker replacing rounds a vanished participant never recorded)."""
        shares, closed = self._read()
        total = sum(share["started"] for share in shares)
        if closed or (total >= self.plan.rounds and not extra):
            return None
        self.started += 1
        self._write()
        return total

    def release(self) -> None:
        """Give back a round started here that could not be timed (the card failed): others may take it."""
        self.started -= 1
        self._write()

    def record(self, number: int, timings: dict[str, float], **figures: dict[str, float]) -> None:
        """A finished round: each implementation's µs, and by figure (FIGURES) its other figures."""
        self.mine.append({"n": number, "us": timings, **{key: values for key, values in figures.items() if values}})
        self._write()

    def _rounds(self, shares: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
        done = [(r["n"], i, r) for i, share in enumerate(shares) for r in share["rounds"]]
        return [(n, r) for n, _, r in sorted(done, key=lambda item: item[:2])]

    def rounds(self, figure: str = "us") -> list[dict[str, float]]:
        """Every participant's finished rounds, in the order they were started: each implementation's
        `figure` (one of FIGURES) in each (an implementation without it in a round is left out of it)."""
        return [r.get(figure, {}) for _, r in self._rounds(self._read()[0])]

    def pooled(self) -> dict[str, list[dict[str, float]]]:
        """Every finished round (in the order they were started) by figure, from one read: {figure: rounds}."""
        rounds = [r for _, r in self._rounds(self._read()[0])]
        return {key: [r.get(key, {}) for r in rounds] for key in FIGURES}

    def leading_rounds(self, figure: str = "us") -> list[dict[str, float]]:
        """The finished rounds numbered 0, 1, 2, ... up to the first one still running (their `figure`):
        what decisions to stop timing an implementation are taken on, so that every card takes the same ones."""
        out = []
        for n, r in self._rounds(self._read()[0]):
            if n > len(out):
                break
            if n == len(out):
                out.append(r.get(figure, {}))
        return out

    def participants(self) -> int:
        return sum(1 for share in self._read()[0] if share["rounds"])

    def missing(self) -> int:
        """Rounds of the plan not recorded by anyone (after wait_settled: a participant vanished)."""
        return max(0, self.plan.rounds - len(self.rounds()))

    def wait_settled(self, stop: Any, quiet_s: float = QUIET_S) -> list[dict[str, float]]:
        """The pooled rounds once every started round is recorded; a participant silent for `quiet_s`
        (killed mid-round) is not waited for any longer."""
        last, quiet_since = -1, time.monotonic()
        while not stop.is_set():
            shares = self._read()[0]
            finished = sum(len(share["rounds"]) for share in shares)
            if finished >= sum(share["started"] for share in shares):
                break
            if finished != last:
                last, quiet_since = finished, time.monotonic()
            elif time.monotonic() - quiet_since > quiet_s:
                break
            time.sleep(POLL_S)
        return self.rounds()
