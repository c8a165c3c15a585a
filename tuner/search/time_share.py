"""--time-budget across the problems of a search: one budget for the whole run, not one per problem.

Each worker takes its studies in turn. A study started at `now` gets an even share of what is left,
(end - now) / (studies left), for its baselines, its trials and its confirm stage: its trials stop (no new
one starts) once the share less the time its confirm stage is expected to take (the worker's previous
ones) has passed, never before half the share. A study that finishes early leaves its time to the rest;
one that overruns takes it from them. Once the budget is spent, the studies left are not started: the
search ends and says which problems it did not tune.
"""

from __future__ import annotations


def trial_deadline(now: float, end: float, studies_left: int, confirm_s: float = 0.0) -> float:
    """When a study started at `now` stops starting trials, of a budget that ends at `end`."""
    share = max(end - now, 0.0) / max(studies_left, 1)
    return now + max(share - confirm_s, share / 2)


def split_line(budget_s: float, problems: int) -> str:
    """How the budget of a search of several problems is shared, said before it starts (within 80 columns)."""
    return f"time budget {duration(budget_s)} shared by {problems} problems: each gets time left / problems left"


def duration(seconds: float) -> str:
    """A short human duration: 45 s, 12m 5s, 1h 20m."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"
