"""The ask/tell loop of one study on one worker (ProblemSearch).

Per asked point:
- infeasible -> stored as `pruned` with the reason, told PRUNED, never compiled, not counted against --trials;
- already measured (same problem, template hash, parameters, GPU; with the objective's figure) -> told the stored
  result, no new row (a timeout or launch error: only this study's own); being measured by another worker -> waits;
- otherwise -> compiled (a thread pool running ahead of the GPU; nvcc runs in subprocesses), measured by the
  Backend, stored (one transaction), told (the objective's figure, tuner.runtime.objective; or FAIL/PRUNED).
The next trial goes to the GPU worker before the previous one is stored and told, and the sampler is asked
while the card measures: the parent's work (ASKING, STORING) hides behind the GPU's, and MEASURING is the rest.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from typing import Any, Optional

import optuna
from optuna.trial import Trial, TrialState

from tuner.backends.base import Measured, Measurement, submit_measure
from tuner.kernels.compiler import CompileResult
from tuner.kernels.feasibility import Feasibility, check
from tuner.kernels.manifest import Manifest, load_manifest
from tuner.kernels.variant import Variant, variant_from_params
from tuner.runtime.build import BuiltKernel
from tuner.runtime.objective import figure, required_column
from tuner.search.answers import KnownAnswers
from tuner.search.early_stop import study_plateaued
from tuner.search.in_hand import InFlight, Pending
from tuner.search.job import (DUPLICATE_WAIT_S, MAX_INFEASIBLE_STREAK, MAX_REPEAT_STREAK, MAX_UNMEASURABLE_STREAK,
                              MEASURING, WAITING_FOR_WORKERS, ASKING, STORING, Context, WorkerJob, lookahead_for,
                              point)
from tuner.search.liveness import (Heartbeat, abandoned, budget_taken, over_budget, reap, running_duplicate,
                                   trial_by_number)  # fmt: skip
from tuner.search.outcome import compile_exception, set_attr, trial_record
from tuner.search.nudge import Nudges
from tuner.search.admissible import restrict
from tuner.search.samplers import FeasiblePoints, distributions
from tuner.search.study import (ATTR_INFEASIBLE, ATTR_INTERRUPTED, ATTR_REASON, ATTR_REPEAT, ATTR_SOURCE, ATTR_STATUS,
                                ATTR_STORE_ID, ATTR_VARIANT, StudyInfo, counts_toward_budget)  # fmt: skip
from tuner.status import TrialStatus
from tuner.store import TrialRow


class ProblemSearch:
    """The ask/tell loop of one study on one worker."""

    def __init__(self, ctx: Context, study: optuna.Study, info: StudyInfo, job: WorkerJob) -> None:
        self.ctx, self.study, self.info, self.job = ctx, study, info, job
        self.problem = info.problem
        self.manifest: Manifest = load_manifest(info.template)
        self.distributions = distributions(self.manifest)
        self.asked = 0
        self.infeasible_streak = 0  # infeasible points asked since the last feasible one
        points = FeasiblePoints(info.template, self.problem, ctx.profile)  # listed once, when first needed
        self._nudge = Nudges(info.template, points)  # told each ask that gave nothing new
        restrict(study.sampler, self.distributions, points)  # TPE picks among the feasible points not held
        self.unmeasurable_streak = 0  # points the backend could not measure since the last measured one
        self._ignored: set[int] = set()  # running trials abandoned mid-ask (a killed process)
        self._pending: deque[Pending] = deque()  # asked ahead, compiling
        self._current: list[Pending] = []  # being launched or measured
        self._in_flight: Optional[InFlight] = None  # on the GPU, its reply not stored yet
        self.cap: Optional[int] = info.budget  # trials the study may hold in all (set again when run starts)
        self._seen = {point(t.params) for t in study.get_trials(deepcopy=False)  # distinct points held
                      if counts_toward_budget(t) or t.state == TrialState.RUNNING}
        self._beat: Optional[Heartbeat] = None  # from start() to the end of run()
        self._known = KnownAnswers(self._find, lambda: ctx.store.reusable_keys(  # the store's answers, found once
            self.problem, info.template, self.manifest.source_hash, ctx.gpu_name, required_column(ctx.objective),
            ctx.replayed_from, study=study.study_name))

    def start(self) -> None:
        """Ask the first points, whose compiles then run while the caller times the baselines; run() goes on."""
        reap(self.study, self.ctx.store)  # trials of dead processes neither block nor hold budget any more
        # The study's budget, shared by every process on it; `tuner worker --trials N` may go N past what is taken.
        self.cap = self.info.budget
        if self.job.beyond_budget and self.job.trials is not None:
            self.cap = max(self.cap or 0, budget_taken(self.study) + self.job.trials)
        self._beat = Heartbeat(self.study, self._in_hand).__enter__()  # the asked points are in hand from now
        try:
            with self.ctx.result.timed(ASKING):
                self._ask_ahead(lookahead_for(self.ctx.compile_pool))
        except KeyboardInterrupt:
            self.ctx.interrupt()  # run() tells what was asked interrupted

    def run(self) -> None:
        if self._beat is None:
            self.start()
        try:
            self._loop(lookahead_for(self.ctx.compile_pool))
        finally:
            self._beat.__exit__()

    def abandon(self) -> None:
        """A search started but not run (the search stopped first): its points asked ahead told interrupted."""
        for item in self._pending:
            self._tell_interrupted(item)
        self._pending.clear()
        if self._beat is not None:
            self._beat.__exit__()

    def _in_hand(self) -> list[int]:
        """Storage ids of the trials this worker asked and has not told yet (_current copied once: the main
        thread changes it meanwhile)."""
        return [item.trial._trial_id for item in list(self._current) + list(self._pending)]

    def _loop(self, lookahead: int) -> None:
        """Ask ahead (the compile pool works on the pending points); collect the GPU's reply, put the
        next point on the GPU, then store and tell the reply while the card measures."""
        try:
            while True:
                with self.ctx.result.timed(ASKING):  # the sampler, and the asked points that need no GPU
                    self._ask_ahead(lookahead)
                if self._in_flight is not None:
                    self._in_flight.measurement = self._in_flight.collect()
                launched = self._launch_next()
                with self.ctx.result.timed(STORING):  # the reply stored and told while the card measures the next
                    self._complete_in_flight()
                self._in_flight = launched
                # Asked again: the trial just completed may have given its budget slot back (an unmeasurable point)
                if launched is None and (self.ctx.stop.is_set() or not self._may_ask()):
                    break
        except KeyboardInterrupt:
            self.ctx.interrupt()
        finally:
            if self._in_flight is not None and self._in_flight.measurement is not None:
                self._complete_in_flight()  # measured before the interrupt: stored like any other
            for item in self._current + list(self._pending):
                self._tell_interrupted(item)
            self._current, self._in_flight = [], None
        if self.ctx.stop.is_set():
            self.ctx.result.interrupted = True

    def _ask_ahead(self, lookahead: int) -> None:
        """Ask until `lookahead` points are pending, or no more may be asked."""
        while len(self._pending) < lookahead and self._may_ask():
            item = self._ask()
            if item is not None:
                self._pending.append(item)

    def _launch_next(self) -> Optional[InFlight]:
        """The next pending point that needs the GPU, sent to it; those settled on the way are stored and told."""
        while self._pending and not self.ctx.stop.is_set():
            item = self._pending.popleft()
            self._current.append(item)
            launched = self._launch(item)
            if launched is not None:
                return launched
            self._current.remove(item)
        return None

    def _may_ask(self) -> bool:
        if self.ctx.stop.is_set() or (self.job.trials is not None and self.asked >= self.job.trials):
            return False
        # The study's budget is shared with every other process working on it. Trials a dead one left
        # behind are settled first: one told the result it stored counts, the others are free.
        reap(self.study, self.ctx.store)
        if self.cap is not None and budget_taken(self.study) >= self.cap:
            return False
        if (held := study_plateaued(self.study, self.info.early_stop)) is not None:  # a resume counts alike
            self.ctx.result.stopped_early[self.study.study_name] = held
            return False
        if self.infeasible_streak >= MAX_INFEASIBLE_STREAK or self.unmeasurable_streak >= MAX_UNMEASURABLE_STREAK:
            return False  # the sampler finds nothing feasible (or measurable: a replay's problem not recorded)
        if self._nudge.repeats >= MAX_REPEAT_STREAK:  # it proposes only points the study holds
            self.ctx.result.exhausted.append(self.study.study_name)
            return False
        if self.job.deadline is not None and self.ctx.hooks.now() >= self.job.deadline:
            return False
        sampler = self.study.sampler
        if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(self.study):
            return False
        return True

    def _ask(self) -> Optional[Pending]:
        """Ask one point; settle it at once when it needs no GPU, else start its compile."""
        trial = self.study.ask(self.distributions)  # owned by this process from its first record (ownership.py)
        variant = variant_from_params(self.info.template, self.problem, trial.params)
        trial.set_user_attr(ATTR_VARIANT, variant.name)
        feasibility = check(variant, self.problem, self.ctx.profile)
        if not feasibility.ok:
            # Stored and told (the sampler learns the region), but free: it does not use up --trials.
            self.infeasible_streak += 1
            self.ctx.result.infeasible += 1
            trial.set_user_attr(ATTR_INFEASIBLE, True)
            self._store(trial, variant, TrialStatus.PRUNED, error=feasibility.reason,
                        smem_bytes=feasibility.smem_bytes or None)
            self._tell_pruned(trial, feasibility.reason, budgeted=False)
            self._nudge.idle(self.study, self.infeasible_streak)
            return None
        self.infeasible_streak = 0
        # Running trials first, the store second: a trial is stored before it is told,
        # so a duplicate that finished in between is found in the store.
        wait_for = running_duplicate(self.study, trial, len(self.distributions), self._ignored)
        if wait_for is not None or self._held(trial.params):
            return self._repeat(trial, variant, feasibility, wait_for)
        self._seen.add(point(trial.params))
        self._nudge.fresh()
        if self.cap is not None and over_budget(self.study, trial.number, self.cap):
            # Another process asked the last budgeted trial at the same moment, with a lower number.
            trial.set_user_attr(ATTR_INTERRUPTED, "over the shared budget")
            self.study.tell(trial, state=TrialState.FAIL)
            self.job = dataclasses.replace(self.job, trials=self.asked)  # ask no more
            return None
        self.asked += 1
        self.ctx.result.asked += 1
        item = Pending(trial, variant, feasibility)
        known = self._known.earlier(variant)
        if known is not None:  # measured by an earlier run: one of this study's points, told from the store
            self._tell_known(trial, known)
            return None
        self._start_compile(item)
        return item

    def _held(self, params: dict[str, Any]) -> bool:
        """Whether the study already holds this point (asked here, or finished by another worker since)."""
        key = point(params)
        if key not in self._seen:  # other workers add points: look again before taking it as new
            self._seen |= {point(t.params) for t in self.study.get_trials(deepcopy=False) if counts_toward_budget(t)}
        return key in self._seen

    def _repeat(self, trial: Trial, variant: Variant, feasibility: Feasibility,
                wait_for: Optional[int]) -> Optional[Pending]:
        """A point this study already holds (or another worker is measuring): told what the store has,
        without using up the budget; the sampler is asked again."""
        self._nudge.idle(self.study, repeat=True)
        trial.set_user_attr(ATTR_REPEAT, True)
        item = Pending(trial, variant, feasibility, wait_for=wait_for, repeat=True)
        if wait_for is not None:
            return item  # still being measured (by another worker, or asked ahead here): wait for it
        known = self._known(variant)
        if known is not None:
            self._tell_known(trial, known, repeat=True)
            return None
        self._unrepeat(item)  # held but never stored (its trial was interrupted): measure it now
        self._start_compile(item)
        return item

    def _unrepeat(self, item: Pending) -> None:
        """The point will be measured here after all: a budgeted trial like any other."""
        item.repeat = False
        item.trial.set_user_attr(ATTR_REPEAT, False)
        self.asked += 1
        self.ctx.result.asked += 1

    def _launch(self, item: Pending) -> Optional[InFlight]:
        if item.wait_for is not None:
            self._complete_in_flight()  # the duplicate may be the trial on the GPU now: stored first
            item.stage = "waiting for a duplicate"
            waited, reused = time.perf_counter(), self._await_duplicate(item)
            self.ctx.result.spent(WAITING_FOR_WORKERS, time.perf_counter() - waited)
            if reused:
                return None
            if self.ctx.stop.is_set():  # stopped while waiting: not measured here, like the trials asked ahead
                self._tell_interrupted(item)
                return None
            if item.repeat:  # the other trial was abandoned: this one measures the point
                self._unrepeat(item)
            self._start_compile(item)
        built: Optional[BuiltKernel] = None
        compiled: Optional[CompileResult] = None
        if item.compile is not None:
            item.stage = "compiling"
            waited = time.perf_counter()
            try:
                built = item.compile.result()
                compiled = built.compiled
            except Exception as exc:  # the compiler itself failed (broken cache entry, OSError, render error)
                compiled = compile_exception(item.variant, self.ctx.profile.nvcc_arch, exc)
            self.ctx.result.spent("waiting for nvcc", time.perf_counter() - waited)
            if not compiled.ok:
                self._store(item.trial, item.variant, TrialStatus.COMPILE_ERROR, compiled=compiled,
                            feasibility=item.feasibility, error="compile error (see the compile log)")
                self._tell(item.trial, TrialState.FAIL, TrialStatus.COMPILE_ERROR, "measured")
                return None
        # NVTX ranges of this trial are named run<id>/trial<n>/<variant>/<phase>.
        prefix = f"run{self.ctx.run_id}/trial{item.trial.number}"
        item.stage = "measuring"
        handle = submit_measure(self.ctx.backend, self.problem, item.variant, built, range_prefix=prefix)
        return InFlight(item, handle, compiled, waited=handle.seconds if isinstance(handle, Measured) else 0.0)

    def _complete_in_flight(self) -> None:
        launched, self._in_flight = self._in_flight, None
        if launched is None:
            return
        measurement = launched.collect()
        self._current.remove(launched.item)
        self.ctx.result.spent(MEASURING, launched.waited)
        self.ctx.result.measured += 1
        self._store_measurement(launched.item, launched.compiled, measurement)

    def _start_compile(self, item: Pending) -> None:
        """Submit the variant to the compile pool, unless the backend measures without compiling."""
        if not getattr(self.ctx.backend, "needs_compile", True):
            return
        assert self.ctx.compile_pool is not None
        item.compile = self.ctx.compile_pool.submit(self.ctx.hooks.build, item.variant, self.ctx.profile.nvcc_arch)

    def _tell_interrupted(self, item: Pending) -> None:
        """Told FAIL, marked interrupted (with its stage: asked ahead, waiting for a duplicate, compiling,
        measuring): it does not count toward the budget and a resume asks again."""
        if item.compile is not None:
            item.compile.cancel()
        try:
            item.trial.set_user_attr(ATTR_INTERRUPTED, item.stage)
            self.study.tell(item.trial, state=TrialState.FAIL)
        except (RuntimeError, ValueError):  # already finished: another worker reaped it
            pass

    def _find(self, variant: Variant) -> Optional[TrialRow]:
        return self.ctx.store.find_trial(self.problem, variant.template, self.manifest.source_hash,
                                         variant.stored_params(), self.ctx.gpu_name,
                                         required_column(self.ctx.objective), self.ctx.replayed_from,
                                         study=self.study.study_name)

    def _await_duplicate(self, item: Pending) -> bool:
        """Wait for the other worker's trial of this variant; True when its result was reused."""
        deadline = time.monotonic() + DUPLICATE_WAIT_S
        while time.monotonic() < deadline and not self.ctx.stop.is_set():
            # Its state first, the store second: it is stored before it is told.
            other = trial_by_number(self.study, item.wait_for)
            known = self._known(item.variant)
            if known is not None:
                self._tell_known(item.trial, known, repeat=item.repeat)
                return True
            if other is None or other.state != TrialState.RUNNING or abandoned(other):
                if other is not None and other.state == TrialState.PRUNED:
                    self._tell_pruned(item.trial, str(other.user_attrs.get(ATTR_REASON, "pruned")),
                                      budgeted=not item.repeat)
                    return True
                return False  # the other trial was abandoned: measure it here
            time.sleep(0.05)
        return False

    def _store_measurement(self, item: Pending, compiled: Optional[CompileResult], m: Measurement) -> None:
        status = TrialStatus.parse(m.status)
        store_id = self._store(item.trial, item.variant, status, measurement=m, compiled=compiled,
                               feasibility=item.feasibility, error=m.error)
        if status is not TrialStatus.PRUNED:
            self.unmeasurable_streak = 0
        set_attr(item.trial, ATTR_STORE_ID, store_id)
        value = figure(self.ctx.objective, m) if status is TrialStatus.OK else None  # an ok one missing it: FAIL
        if value is not None and math.isfinite(value):
            self._tell(item.trial, TrialState.COMPLETE, status, "measured", value)
        elif status is TrialStatus.PRUNED:  # the backend cannot measure the point (a replay that never
            # recorded it): outside the space it serves, so free like an infeasible point
            item.trial.set_user_attr(ATTR_INFEASIBLE, True)
            self.unmeasurable_streak += 1
            self.asked, self.ctx.result.asked = self.asked - 1, self.ctx.result.asked - 1
            self.ctx.result.measured -= 1  # nothing was measured
            self.ctx.result.infeasible += 1
            self._tell_pruned(item.trial, m.error or "pruned by the backend", budgeted=False)
        else:
            self._tell(item.trial, TrialState.FAIL, status, "measured")

    def _tell_known(self, trial: Trial, row: TrialRow, repeat: bool = False) -> None:
        """Told the stored result: a repeat of a point this study holds is free; a point measured by an
        earlier run (another study) is one of the study's distinct points, reused."""
        set_attr(trial, ATTR_STORE_ID, row.id)
        if repeat:
            self.ctx.result.repeated += 1
        else:
            self.ctx.result.reused += 1
        value = figure(self.ctx.objective, row) if row.status is TrialStatus.OK else None
        if value is not None:
            self._tell(trial, TrialState.COMPLETE, row.status, "store", value, budgeted=not repeat)
        else:
            self._tell(trial, TrialState.FAIL, row.status, "store", budgeted=not repeat)

    def _tell_pruned(self, trial: Trial, reason: str, budgeted: bool = True) -> None:
        trial.set_user_attr(ATTR_REASON, reason)
        self._tell(trial, TrialState.PRUNED, TrialStatus.PRUNED, "pruned", budgeted=budgeted)

    def _tell(self, trial: Trial, state: TrialState, status: TrialStatus, source: str,
              value: Optional[float] = None, budgeted: bool = True) -> None:
        try:
            trial.set_user_attr(ATTR_STATUS, status.value)
            trial.set_user_attr(ATTR_SOURCE, source)
            if state == TrialState.COMPLETE:
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=state)
        except (RuntimeError, ValueError):  # reaped by another worker (this process looked dead): stored all the same
            self.ctx.events(("note", self.job.index, f"trial {trial.number} was given up by another worker; "
                                                      "its result is kept in the store"))
            return
        self.ctx.events(("trial", self.job.index, value, budgeted))  # the bar counts what the budget counts

    def _store(self, trial: Trial, variant: Variant, status: TrialStatus, *, error: Optional[str] = None,
               measurement: Optional[Measurement] = None, compiled: Optional[CompileResult] = None,
               feasibility: Optional[Feasibility] = None, smem_bytes: Optional[int] = None) -> int:
        return self.ctx.store.add_trial(trial_record(
            self.ctx.run_id, self.problem, self.manifest.source_hash, self.study.study_name, trial.number, variant,
            status, error=error, measurement=measurement, compiled=compiled,
            smem_bytes=feasibility.smem_bytes if feasibility else smem_bytes))
