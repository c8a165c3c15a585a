"""What Optuna searches: a template's parameters as distributions, study names, samplers.

Every parameter of a manifest is categorical: tile sizes and stage counts are
few, discrete and interact non-smoothly (a tile that does not divide the
problem is not "close" to one that does), so we give Optuna the values as they
are (ints, bools, strings) and let the sampler treat them as categories.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import optuna
from optuna.distributions import CategoricalDistribution

from tuner.errors import TunerError
from tuner.search.admissible import AdmissibleTPESampler
from tuner.kernels.feasibility import feasible_space
from tuner.kernels.manifest import Manifest
from tuner.kernels.variant import mask_suffix
from tuner.problem import Problem
from tuner.store.records import canonical_json

SAMPLERS = ("tpe", "gp", "cmaes", "random", "grid")
DEFAULT_SAMPLER = "tpe"  # `tuner replay-eval` compares it with the others (benchmarks/replay_eval/)


def distributions(manifest: Manifest) -> dict[str, CategoricalDistribution]:
    """One categorical distribution per manifest parameter, values in manifest order."""
    return {name: CategoricalDistribution(list(spec.values)) for name, spec in manifest.params.items()}


def grid_space(manifest: Manifest) -> dict[str, list[Any]]:
    return {name: list(spec.values) for name, spec in manifest.params.items()}


def problem_key(problem: Problem) -> str:
    """Deterministic, filename-safe text of a problem, e.g. B16H16S2048S2048D64-fp16 or
    B1H8S4096S4096D128-bf16-causal-wl1024-sc50 (-backward: the backward pass)."""
    gqa = f"Hkv{problem.heads_kv}" if problem.heads_kv != problem.heads else ""
    key = f"B{problem.batch}H{problem.heads}{gqa}S{problem.seq_q}S{problem.seq_k}D{problem.head_dim}-{problem.dtype}"
    if problem.causal:
        key += "-causal"
    key += mask_suffix(problem.window_left, problem.window_right, problem.softcap, sep="-")
    if problem.layout != "bhsd":
        key += f"-{problem.layout}"
    if problem.ragged:
        key += "-" + problem.lengths.replace(":", "")  # uniform:1024 -> uniform1024
    if problem.backward:  # the backward of a problem is a study of its own
        key += "-backward"
    return key


def study_name(profile: str, template: str, problem: Problem, objective: str = "time") -> str:
    """The default study name: h100-attn_fwd_mma-B16H16S2048S2048D64-fp16, suffixed with an objective
    other than time (-energy, -isolated): studies of different objectives never meet on --resume."""
    suffix = "" if objective == "time" else f"-{objective}"
    return f"{profile}-{template}-{problem_key(problem)}{suffix}"


def make_sampler(name: str, seed: int | None, manifest: Manifest) -> optuna.samplers.BaseSampler:
    """The sampler called `name` (one of SAMPLERS), seeded."""
    factories: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        # constant_liar: pending trials (other workers, compiles running ahead)
        # count as bad, so parallel asks spread out instead of piling up.
        # Restricted by the search loop to the problem's admissible points (feasible, not held): tuner.search.admissible.
        "tpe": lambda: AdmissibleTPESampler(seed=seed, multivariate=True, constant_liar=True),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        # CMA-ES models numerical parameters only: with our all-categorical
        # space it samples every parameter with its independent sampler
        # (random); kept for spaces with numerical parameters.
        "cmaes": lambda: optuna.samplers.CmaEsSampler(
            seed=seed, warn_independent_sampling=False,
            independent_sampler=optuna.samplers.RandomSampler(seed=seed),
        ),
        "grid": lambda: optuna.samplers.GridSampler(grid_space(manifest), seed=seed),
        "gp": lambda: _gp_sampler(seed),
    }
    key = name.strip().lower()
    if key not in factories:
        raise TunerError(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLERS)}")
    return factories[key]()


def _gp_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    cls = getattr(optuna.samplers, "GPSampler", None)
    if cls is None:
        raise TunerError(f"--sampler gp needs optuna >= 3.6 (GPSampler); optuna {optuna.__version__} is installed")
    return cls(seed=seed)



class FeasiblePoints:
    """A problem's feasible points (parameter dicts) for one template, listed at the first call and kept: the
    sampler's restriction and the nudge share one listing (0.3-0.5 s for a prefill space)."""

    def __init__(self, template: str, problem: Any, profile: Any) -> None:
        self._space = (template, problem, profile)
        self._points: list[dict[str, Any]] | None = None

    def __call__(self) -> list[dict[str, Any]]:
        if self._points is None:
            self._points = [dict(v.params) for v in feasible_space(*self._space)]
        return self._points


class FeasibleNudge:
    """Queues a feasible point the study has not asked yet (ProblemSearch: after INFEASIBLE_NUDGE infeasible points
    in a row, and after IDLE_NUDGE asks in a row that gave nothing new). A sampler can sink into the infeasible part
    of a mostly infeasible space (a windowed D256 problem's TPE, seed 21, asked 500 in a row) and the search would end
    with nothing measured; on a small space it proposes held points again and again (a decode study asked 6-7 times
    per measured trial). `near`: among the unasked points, one of those that differ from it in the fewest parameters
    (the study's best: the region the sampler keeps proposing). The point is chosen by the study's name and `key`, so
    a seeded search repeats it."""

    def __init__(self, points: FeasiblePoints) -> None:
        self._points = points

    def __call__(self, study: optuna.Study, key: int | str, near: dict[str, Any] | None = None) -> bool:
        """Queue one; False when every feasible point has been asked."""
        asked = {canonical_json(t.params) for t in study.get_trials(deepcopy=False)}
        fresh = [p for p in self._points() if canonical_json(p) not in asked]
        if not fresh:
            return False
        if near is not None:
            distance = {i: sum(p.get(name) != value for name, value in near.items()) for i, p in enumerate(fresh)}
            closest = min(distance.values())
            fresh = [p for i, p in enumerate(fresh) if distance[i] == closest]
        study.enqueue_trial(random.Random(f"{study.study_name}:{key}").choice(fresh), skip_if_exists=True)
        return True
