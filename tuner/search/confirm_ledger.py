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
    data = attrs.read().get(PLAN_KEY)
    return Plan.from_json(data) if isinstance(data, dict) else None


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
    """One participant's view of a plan's rounds."""

    def __init__(self, attrs: Attributes, plan: Plan, me: str) -> None:
        self.attrs, self.plan = attrs, plan
        self.key = f"{SHARE_PREFIX}{plan.id}:{me}"
        self.started = 0
        self.mine: list[dict[str, Any]] = []

    def _shares(self) -> list[dict[str, Any]]:
        prefix = f"{SHARE_PREFIX}{self.plan.id}:"
        return [value for key, value in sorted(self.attrs.read().items()) if key.startswith(prefix)]

    def _write(self) -> None:
        self.attrs.write(self.key, {"started": self.started, "rounds": self.mine})

    def begin_round(self) -> Optional[int]:
        """Start a round (its number, which rotates the order of its timings), or None when the plan's
        rounds are all started."""
        total = sum(share["started"] for share in self._shares())
        if total >= self.plan.rounds:
            return None
        self.started += 1
        self._write()
        return total

    def record(self, timings: dict[str, float]) -> None:
        self.mine.append({"t": time.time(), "us": timings})
        self._write()

    def rounds(self) -> list[dict[str, float]]:
        """Every participant's finished rounds, in the order they finished."""
        done = [r for share in self._shares() for r in share["rounds"]]
        return [r["us"] for r in sorted(done, key=lambda r: r["t"])]

    def participants(self) -> int:
        return sum(1 for share in self._shares() if share["rounds"])

    def wait_settled(self, stop: Any, quiet_s: float = QUIET_S) -> list[dict[str, float]]:
        """The pooled rounds once every started round is recorded; a participant silent for `quiet_s`
        (killed mid-round) is not waited for any longer."""
        last, quiet_since = -1, time.monotonic()
        while not stop.is_set():
            shares = self._shares()
            finished = sum(len(share["rounds"]) for share in shares)
            if finished >= sum(share["started"] for share in shares):
                break
            if finished != last:
                last, quiet_since = finished, time.monotonic()
            elif time.monotonic() - quiet_since > quiet_s:
                break
            time.sleep(POLL_S)
        return self.rounds()
