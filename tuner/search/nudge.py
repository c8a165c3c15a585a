"""When a study's sampler gives it nothing new, a feasible point it has not asked is queued (Nudges)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.search.samplers import FeasibleNudge, FeasiblePoints

INFEASIBLE_NUDGE = 25  # infeasible points in a row after which a feasible point is queued
# Asks in a row that give the study nothing new (points it holds, proposed again; infeasible points) after which an
# unasked feasible point near its best is queued (0: INFEASIBLE_NUDGE only). A decode study's TPE asked 6-7 times a
# measured trial, each ask a sample over all its trials (NOTES, session 25, call 6); benchmarks/repeat_nudge.
IDLE_NUDGE = 4
# The templates it serves: measured on replays, decode studies asked 15.1 -> 4.2 times a trial with the same winner
# on 8 of 8 seeds; a prefill study's winner came out > 1% worse on 4 of 16 seeds (better on 5), so prefill keeps the
# sampler's own course (issue 38: keep what is not better off).
IDLE_NUDGE_TEMPLATES = ("attn_decode",)


def idle_nudge_for(template: str) -> int:
    """Asks in a row that give nothing new after which a study of `template` is nudged (0: never)."""
    return IDLE_NUDGE if template.startswith(IDLE_NUDGE_TEMPLATES) else 0


class Nudges:
    """The nudges of one study's loop (ProblemSearch): it says which asks gave nothing new and which a new point."""

    def __init__(self, template: str, points: FeasiblePoints) -> None:
        self._queue = FeasibleNudge(points)
        self._every = idle_nudge_for(template)
        self.streak = 0  # asks in a row that gave the study nothing new
        self.repeats = 0  # of them, proposals of points the study holds (the loop ends the study after too many)
        self.queued = 0  # points queued by the idle nudge

    def fresh(self) -> None:
        """The ask gave the study a new point."""
        self.streak = self.repeats = 0

    def idle(self, study: optuna.Study, infeasible_streak: int = 0, repeat: bool = False) -> None:
        """One more ask that gave nothing new: a point the study holds (`repeat`) or an infeasible one
        (`infeasible_streak`: the infeasible points in a row, this one too). The next ask takes a queued point, so
        the sampler is not asked again and again; once every feasible point is held none is queued, and the loop's
        streaks end the study as before."""
        self.streak += 1
        self.repeats += repeat
        if self._every and self.streak % self._every == 0:
            done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            self.queued += 1
            if self._queue(study, f"idle{self.queued}", near=min(done, key=lambda t: t.value).params if done else None):
                return
        if infeasible_streak and infeasible_streak % INFEASIBLE_NUDGE == 0:
            self._queue(study, infeasible_streak)
