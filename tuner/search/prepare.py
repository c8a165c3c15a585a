"""Preparing a search: its problems, and per problem a study (created, or loaded with --resume) with a budget.

A new study is warm-started with the best variants of the nearest recorded
problem, enqueued before the sampler's own points.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import optuna

from tuner.errors import TunerError
from tuner.kernels.feasibility import default_template, feasible_space, tunes_problem
from tuner.kernels.manifest import Manifest
from tuner.kernels.variant import mask_of
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import GpuProfile
from tuner.search.options import DEFAULT_TRIALS, SearchOptions
from tuner.search.samplers import make_sampler, problem_key, study_name
from tuner.search.study import (
    ATTR_BUDGET,
    ATTR_EARLY_STOP,
    ATTR_OBJECTIVE,
    ATTR_PROBLEM,
    ATTR_PROFILE,
    ATTR_SAMPLER,
    ATTR_SEED,
    ATTR_TEMPLATE,
    load_study,
    study_exists,
    study_info,
    unfinished,
)  # fmt: skip
from tuner.status import TrialStatus
from tuner.store import Store, TrialFilter, open_store


def shape_problems(options: SearchOptions) -> list[Problem]:
    """The problems named by --shape (with --dtype, --causal, --hkv, --layout, --lengths, --window, --softcap and
    --pass: forward or backward; run_search splits --pass both)."""
    return [problem_from_shape(s, dtype=options.dtype, causal=options.causal, heads_kv=options.heads_kv,
                               layout=options.layout, lengths=options.lengths, window=options.window,
                               softcap=options.softcap, kernel_pass=options.kernel_pass) for s in options.shapes]


def choose_template(options: SearchOptions, profile: GpuProfile, storage: Any = None) -> str:
    """--template; else, resuming, the template of the study being resumed; else the first of the
    profile's templates (best first) that suits every requested problem (and, replaying, that the
    recording holds); when none suits them all, the last (most general) one, which then names the
    problems it skips."""
    if options.template:
        return options.template
    wanted = shape_problems(options) if options.shapes else default_problems(options, profile)
    templates_of_pass = list(profile.templates_for(options.kernel_pass))
    if options.resume and storage is not None and wanted:
        several = len(wanted) > 1
        names = ([study_name_for(options, profile, wanted[0], several)] if options.study else
                 [study_name(profile.name, t, wanted[0], options.objective) for t in templates_of_pass])
        templates = [None] if options.study else templates_of_pass
        for name, template in zip(names, templates):
            if study_exists(storage, name):
                study = load_study(storage, name)
                if not unfinished(study):
                    return study_info(study).template
                # Its creation stopped before its attributes were written: its name (or what it has) says it.
                if study.user_attrs.get(ATTR_TEMPLATE, template):
                    return study.user_attrs.get(ATTR_TEMPLATE, template)
    candidates = templates_of_pass
    if options.backend == "replay" and options.replay_from:
        with open_store(options.replay_from, create=False) as source:
            recorded = [t for t in candidates if source.query_trials(TrialFilter(gpu=profile.name, template=t, limit=1))]
        candidates = recorded or candidates
    return default_template(profile, wanted, candidates)


def problems_of(options: SearchOptions, profile: GpuProfile, manifest: Manifest,
                say: Callable[[str], None]) -> list[Problem]:
    """--shape problems (each must suit the template), or the profile's defaults that do."""
    if options.shapes:
        problems = shape_problems(options)
        for p in problems:
            why = tunes_problem(manifest, p)
            if why:
                raise TunerError(f"cannot tune {p.label}: {why}")
        return list(dict.fromkeys(problems))
    problems = []
    for p in default_problems(options, profile):
        why = tunes_problem(manifest, p)
        if why:
            say(f"skipping default problem {p.label}: {why}")
        else:
            problems.append(p)
    if not problems:
        raise TunerError(f"none of {profile.name}'s default problems suits template {manifest.name}; give --shape")
    return problems


def default_problems(options: SearchOptions, profile: GpuProfile) -> list[Problem]:
    """The profile's default problems, in the pass the search tunes."""
    return [dataclasses.replace(p, kernel_pass=options.kernel_pass) for p in profile.default_problems]


@dataclass(frozen=True)
class WarmStart:
    points: list[dict[str, Any]]  # parameters to enqueue, first tried first
    sources: list[str]  # where they come from, for the log


def _tunables(params: dict[str, Any], manifest: Manifest) -> Optional[dict[str, Any]]:
    """The template's parameters of stored params, or None when recorded with an older manifest."""
    out = manifest.with_absent({k: v for k, v in params.items() if k in manifest.params})
    if set(out) != set(manifest.params) or any(v not in manifest.params[n].values for n, v in out.items()):
        return None
    return out


def warm_start_points(store: Store, profile: str, template: str, problem: Problem, k: int,
                      manifest: Manifest) -> WarmStart:
    """Up to `k` points for a new study: the confirmed winners of the nearest tuned problems first, then
    the best ok variants of the nearest one (same GPU profile, template, head dim, dtype, causality,
    window and softcap; nearest in log(B*H*Sq*Sk))."""
    if k <= 0:
        return WarmStart([], [])
    best = store.best_trials(TrialFilter(gpu=profile, template=template, dtype=problem.dtype, causal=problem.causal))
    # Another window or softcap is another kernel (its tiles were picked for other work per key tile).
    candidates = {row.problem for row in best if row.profile == profile and row.problem.head_dim == problem.head_dim
                  and mask_of(row.problem) == mask_of(problem)}
    size = math.log(problem.batch * problem.heads * problem.seq_q * problem.seq_k)
    nearest = sorted(candidates, key=lambda p: (abs(math.log(p.batch * p.heads * p.seq_q * p.seq_k) - size),
                                                p != problem, p))
    points: list[dict[str, Any]] = []
    sources: list[str] = []
    for near in nearest:
        confirmed = store.confirmed(near, profile)
        if len(points) < k and confirmed is not None and confirmed.variant_name.startswith(template + "_"):
            params = _tunables(store.trial_detail(confirmed.trial_id).params, manifest)
            if params is not None and params not in points:
                points.append(params)
                sources.append(f"the confirmed winner of {near.label}")
    if nearest and len(points) < k:
        rows = store.query_trials(TrialFilter(gpu=profile, problem=nearest[0], template=template,
                                              status=TrialStatus.OK))
        before = len(points)
        for row in sorted((r for r in rows if r.profile == profile and r.median_us is not None),
                          key=lambda r: r.median_us):
            params = _tunables(row.params, manifest)
            if params is not None and params not in points:
                points.append(params)
            if len(points) == k:
                break
        if len(points) > before:
            sources.append(f"the {len(points) - before} best of {nearest[0].label}")
    return WarmStart(points, sources)


def study_name_for(options: SearchOptions, profile: GpuProfile, problem: Problem, several: bool) -> str:
    """--study NAME (suffixed with the problem when the search has several), else the default name."""
    if options.study:
        return f"{options.study}-{problem_key(problem)}" if several else options.study
    return study_name(profile.name, options.template, problem, options.objective)


def _check_new_study(options: SearchOptions, store: Store, name: str) -> None:
    """Refuse to start `name` afresh where that would be a mistake: --resume of a study that is not
    there, or a store that holds trials of the study while the Optuna storage lacks it (a store copied
    without its old journal file: starting again would give duplicate trial numbers)."""
    stored = store.query_trials(TrialFilter(study=name, limit=1))
    if stored:
        raise TunerError(f"the store holds trials of study {name!r} but its Optuna storage has no such study "
                         f"(a store copied without its .optuna.journal file?); restore the journal, or pass "
                         f"--study NAME for a new study")
    if options.resume and options.study:
        raise TunerError(f"no study {name!r} to resume; drop --resume to start it")


def prepare_study(options: SearchOptions, storage: Any, store: Store, profile: GpuProfile, manifest: Manifest,
                  problem: Problem, name: str, say: Callable[[str], None] = lambda _text: None
                  ) -> tuple[optuna.Study, Optional[int]]:
    """Create (or with --resume, load) the study; returns it and its total trial budget. A study whose creation
    stopped before its attributes were written (a kill, or its creator still at it) is completed."""
    sampler = make_sampler(options.sampler, options.seed, manifest)  # validates the name early
    study = _existing_study(storage, name, sampler)
    if study is None:
        _check_new_study(options, store, name)
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=sampler)
        except optuna.exceptions.DuplicatedStudyError:  # another start created it since we looked
            study = load_study(storage, name, sampler)
            if not unfinished(study):
                return _resumed(options, study, profile, problem, name)
    elif not unfinished(study):
        return _resumed(options, study, profile, problem, name)
    budget = _write_attributes(options, study, profile, manifest, problem)
    if options.sampler != "grid":  # the grid covers every point anyway
        warm = warm_start_points(store, profile.name, options.template, problem, options.warm_start, manifest)
        for params in warm.points:
            study.enqueue_trial(params, skip_if_exists=True)
        if warm.sources:
            say(f"{problem.label}: warm start from {', '.join(warm.sources)}")
    return study, budget


def _existing_study(storage: Any, name: str, sampler: optuna.samplers.BaseSampler) -> Optional[optuna.Study]:
    return load_study(storage, name, sampler) if study_exists(storage, name) else None


def _resumed(options: SearchOptions, study: optuna.Study, profile: GpuProfile, problem: Problem,
             name: str) -> tuple[optuna.Study, Optional[int]]:
    """A study `tuner search` created, checked against the options and given the budget to resume with."""
    if not options.resume:
        raise TunerError(f"study {name!r} already exists; pass --resume to continue it, or --study NAME for a new one")
    info = study_info(study)
    if (info.problem, info.template, info.profile) != (problem, options.template, profile.name):
        raise TunerError(f"study {name!r} tunes {info.template} for {info.problem.label} on {info.profile}, "
                         f"not {options.template} for {problem.label} on {profile.name}")
    if info.objective != options.objective:  # its values are another figure: they must not mix
        raise TunerError(f"study {name!r} minimizes {info.objective}, not {options.objective}; resume it with "
                         f"--objective {info.objective}, or pass --study NAME for a new study")
    budget = options.trials if options.trials is not None else info.budget
    if budget is None and options.time_budget_s is None:  # started with --time-budget alone
        raise TunerError(f"study {name!r} has no trial budget (it was started with --time-budget alone): "
                         f"give --trials or --time-budget to resume it")
    if options.early_stop is not None:  # given again: it replaces the study's own; else the study keeps its own
        study.set_user_attr(ATTR_EARLY_STOP, options.early_stop)
    study.set_user_attr(ATTR_BUDGET, budget)
    return study, budget


def _write_attributes(options: SearchOptions, study: optuna.Study, profile: GpuProfile, manifest: Manifest,
                      problem: Problem) -> Optional[int]:
    """Write a new study's attributes, the budget last (its presence marks the creation finished), before the
    warm start's queries: a study interrupted there (Ctrl-C) resumes with its own budget. Completing a study
    another start created, only the attributes it lacks are written: those it has must agree."""
    budget = options.trials
    if budget is None and options.sampler == "grid":
        # Every feasible point once: only feasible points are budgeted trials.
        budget = len(feasible_space(manifest.name, problem, profile))
    if budget is None and options.time_budget_s is None:
        budget = DEFAULT_TRIALS
    have = study.user_attrs
    wanted = ((ATTR_PROBLEM, problem.to_dict()), (ATTR_TEMPLATE, options.template), (ATTR_PROFILE, profile.name),
              (ATTR_OBJECTIVE, options.objective))
    clash = [key for key, value in wanted if key in have and have[key] != value]
    if clash:
        raise TunerError(f"study {study.study_name!r} was started for another {', '.join(clash)}; "
                         f"pass --study NAME for a new study")
    for key, value in (*wanted[:3], (ATTR_SAMPLER, options.sampler), (ATTR_SEED, options.seed), wanted[3],
                       (ATTR_EARLY_STOP, options.early_stop), (ATTR_BUDGET, budget)):
        if key not in have:
            study.set_user_attr(key, value)
    return budget
