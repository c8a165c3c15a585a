"""Progress of a search: one rich progress bar per problem, fed by events.

Workers (in this process or in child processes, through a queue) send plain
tuples, so the same display serves one device or many:

    ("baseline", problem_index, figure, impl)
    ("trial", problem_index, figure_or_None, budgeted)      budgeted: counts toward --trials
(`figure`: the objective's, tuner.runtime.objective: median µs, J per call or isolated µs)
    ("note", problem_index, text)                            a line to show (e.g. from the confirm stage)
    ("finished", problem_index)                              the problem is tuned (its confirm stage included)

With several problems a last row counts the problems done and gives the time left, estimated from the
problems done so far (their mean wall time), within the --time-budget; each problem done says so in a line.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.problem import Problem
from tuner.runtime.objective import TIME, shown
from tuner.search.time_share import duration


class SearchProgress:
    def __init__(self, console: Console, enabled: bool = True, now: Callable[[], float] = time.monotonic) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._tasks: dict[int, Any] = {}
        self._problems: dict[int, str] = {}
        self._best: dict[int, Optional[float]] = {}
        self._baseline: dict[int, Optional[tuple[float, str]]] = {}
        self._objective: dict[int, str] = {}
        self._now = now
        self._overall: Optional[Any] = None  # the problems row (several problems)
        self._count, self._finished, self._started = 0, 0, now()
        self._budget_s: Optional[float] = None

    def __enter__(self) -> "SearchProgress":
        self._progress.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._progress.stop()

    def add_problem(self, index: int, problem: Problem, total: Optional[int], done: int = 0,
                    objective: str = TIME) -> None:
        self._tasks[index] = self._progress.add_task(problem.label, total=total, completed=done, best="")
        self._problems[index] = problem.label
        self._objective[index] = objective
        self._best[index] = None
        self._baseline[index] = None

    def track_problems(self, count: int, budget_s: Optional[float] = None) -> None:
        """A row for the `count` problems (several) with the time left, which the search's --time-budget
        `budget_s` bounds; the clock starts now."""
        self._count, self._started, self._budget_s = count, self._now(), budget_s
        if count > 1:
            self._overall = self._progress.add_task(f"{count} problems", total=count, best=self.eta_text())

    def eta_text(self) -> str:
        """The time left: the problems left at the mean wall time of those done, within the time budget."""
        elapsed = self._now() - self._started
        budget_left = None if self._budget_s is None else max(self._budget_s - elapsed, 0.0)
        if self._finished >= self._count:
            return "all done"
        if not self._finished:
            return "time left: after the first problem" if budget_left is None else \
                f"at most {duration(budget_left)} left"
        left = elapsed / self._finished * (self._count - self._finished)
        if budget_left is not None:
            left = min(left, budget_left)
        return f"about {duration(left)} left"

    def _finish(self, index: int) -> None:
        self._finished += 1
        if self._overall is None:
            return
        self._progress.update(self._overall, advance=1, best=self.eta_text())
        text = f"{self._finished}/{self._count} problems done in {duration(self._now() - self._started)}"
        if self._finished < self._count:
            text += f"; {self.eta_text()}"
        self._progress.console.print(text, markup=False, highlight=False)

    def best_text(self, index: int) -> str:
        best, baseline = self._best.get(index), self._baseline.get(index)
        if best is None:
            return "best -"
        text = f"best {shown(self._objective.get(index, TIME), best)}"
        if baseline is not None:
            text += f", {baseline[0] / best:.2f}x vs {baseline[1]}"
        return text

    def handle(self, event: tuple) -> None:
        kind, index = event[0], event[1]
        if index not in self._tasks:
            return
        if kind == "note":
            self._progress.console.print(f"{self._problems[index]}: {event[2]}", markup=False, highlight=False)
            return
        if kind == "finished":
            self._finish(index)
            return
        if kind == "baseline":
            us, impl = event[2], event[3]
            current = self._baseline[index]
            if current is None or us < current[0]:
                self._baseline[index] = (us, impl)
        elif kind == "trial":
            value = event[2]
            if value is not None and (self._best[index] is None or value < self._best[index]):
                self._best[index] = value
            if len(event) < 4 or event[3]:  # infeasible points are free: they do not fill the bar
                self._progress.advance(self._tasks[index])
        self._progress.update(self._tasks[index], best=self.best_text(index))
