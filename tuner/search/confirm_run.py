"""`tuner confirm`: the confirm stage for problems already in the store, without a new search.

    confirmed = run_confirm(ConfirmOptions(gpu="h100", shapes=("8,16,2048,128",)))
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

from tuner.errors import TunerError
from tuner.problem import parse_shape
from tuner.profiles import load_profile, resolve_profile
from tuner.search.confirm import DEFAULT_CONFIRM, DEFAULT_ROUNDS, confirm_problem
from tuner.search.hooks import Hooks, check_backend, check_replay_source, require_gpus
from tuner.search.job import Context
from tuner.store import ConfirmedRow, RunInfo, TrialFilter, default_db_url, open_store
from tuner.store.redact import redact_url


@dataclass(frozen=True)
class ConfirmOptions:
    gpu: str = "auto"
    shapes: tuple[str, ...] = ()  # B,H,S,D / B,H,Sq,Sk,D; empty: every problem with ok trials on the profile
    confirm: int = DEFAULT_CONFIRM
    rounds: int = DEFAULT_ROUNDS
    db_url: Optional[str] = None
    backend: str = "gpu"
    replay_from: Optional[str] = None
    device: int = 0
    force: bool = False
    objective: str = "time"  # what the stage ranks by (tuner.runtime.objective)


def run_confirm(options: ConfirmOptions, say: Callable[[str], None], hooks: Hooks = Hooks()) -> list[ConfirmedRow]:
    """Re-time the best stored variants of each problem interleaved with the baselines; the confirmed winners."""
    check_backend(options.backend)
    check_replay_source(options.backend, options.replay_from)
    if options.confirm < 1 or options.rounds < 1:
        raise TunerError("--confirm and --rounds must be at least 1")
    if options.backend == "gpu":
        require_gpus((options.device,))
        profile = resolve_profile(options.gpu, force=options.force, device=options.device)
    else:
        profile = load_profile(options.gpu)
    db_url = options.db_url or default_db_url()
    with open_store(db_url, create=False) as store:
        filters = [TrialFilter(gpu=profile.name, shape=parse_shape(s)) for s in options.shapes] or \
                  [TrialFilter(gpu=profile.name)]
        best = [r for f in filters for r in store.best_trials(f) if r.profile == profile.name]
        if not best:
            raise TunerError(f"no ok trials for {profile.name} in {store.url}: nothing to confirm")
        backend = hooks.make_backend(options.backend, options.device, profile, replay_from=options.replay_from,
                                     force=options.force, objective=options.objective)
        try:
            facts = backend.device_facts()
            replayed_from = redact_url(options.replay_from) if options.replay_from else None
            run_id = store.start_run(RunInfo.for_this_process(
                gpu_name=facts.gpu_name, profile=profile.name, gpu_uuid=facts.gpu_uuid, driver=facts.driver,
                cuda_version=facts.cuda_version, replayed_from=replayed_from, objective=options.objective))
            ctx = Context(store, backend, run_id, profile, facts.gpu_name, None, threading.Event(),
                          lambda _event: None, hooks, objective=options.objective, replayed_from=replayed_from)
            try:
                for row in {r.problem: r for r in best}.values():
                    tell = lambda text, p=row.problem: say(f"{p.label}: {text}")  # noqa: E731
                    try:
                        confirm_problem(ctx, row.problem, row.template, options.confirm, options.rounds, tell)
                    except TunerError as exc:  # one problem's failure does not cost the others theirs
                        tell(f"confirm stage failed: {exc}")
            finally:
                store.finish_run(run_id)
            return [c for c in (store.confirmed(r.problem, profile.name) for r in best) if c and c.run_id == run_id]
        finally:
            backend.close()
