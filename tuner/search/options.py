"""What `tuner search` is asked to do: its options, checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tuner.errors import TunerError
from tuner.problem import PASSES, check_softcap, check_window
from tuner.runtime.objective import DEFAULT_OBJECTIVE, OBJECTIVES
from tuner.search.confirm import DEFAULT_CONFIRM, DEFAULT_ROUNDS
from tuner.search.hooks import check_backend, check_replay_source
from tuner.search.samplers import DEFAULT_SAMPLER, SAMPLERS

DEFAULT_TRIALS = 100
WARM_START = 3  # best variants of the nearest recorded problem, enqueued first
BOTH = "both"  # --pass both: the forward studies of the problems, then their backward ones
PASS_CHOICES = (*PASSES, BOTH)


@dataclass(frozen=True)
class SearchOptions:
    gpu: str = "auto"
    shapes: tuple[str, ...] = ()
    heads_kv: Optional[int] = None
    dtype: str = "fp16"
    causal: bool = False
    layout: str = "bhsd"
    lengths: str = "full"  # Problem.lengths: full or uniform:LO
    window: tuple[int, int] = (-1, -1)  # Problem.window_left / window_right (-1 unbounded)
    softcap: float = 0.0  # Problem.softcap (0 off)
    template: Optional[str] = None  # None: the profile's first template that suits every problem
    trials: Optional[int] = None
    time_budget_s: Optional[float] = None
    sampler: str = DEFAULT_SAMPLER
    seed: Optional[int] = None
    study: Optional[str] = None
    resume: bool = False
    devices: tuple[int, ...] = (0,)
    db_url: Optional[str] = None
    backend: str = "gpu"
    replay_from: Optional[str] = None
    force: bool = False
    warm_start: int = WARM_START
    confirm: int = DEFAULT_CONFIRM  # best distinct variants re-timed interleaved with the baselines (0: off)
    confirm_rounds: int = DEFAULT_ROUNDS
    objective: str = DEFAULT_OBJECTIVE  # time, energy or isolated (tuner.runtime.objective)
    early_stop: Optional[int] = None  # end a study after N budgeted trials without a gain beyond the noise
    kernel_pass: str = "forward"  # PASS_CHOICES: the pass the problems tune (Problem.kernel_pass), or both


def validate_options(options: SearchOptions) -> None:
    """A one-line TunerError for the first option out of range."""
    if options.sampler not in SAMPLERS:
        raise TunerError(f"unknown sampler {options.sampler!r}; expected one of {', '.join(SAMPLERS)}")
    check_backend(options.backend)
    if options.kernel_pass not in PASS_CHOICES:
        raise TunerError(f"unknown pass {options.kernel_pass!r}; expected one of {', '.join(PASS_CHOICES)}")
    if options.kernel_pass == BOTH and (options.template or options.study):
        raise TunerError("--pass both tunes two templates in two sets of studies: --template and --study name one; "
                         "run --pass forward and --pass backward apart to give them")
    if options.objective not in OBJECTIVES:
        raise TunerError(f"unknown objective {options.objective!r}; expected one of {', '.join(OBJECTIVES)}")
    if options.seed is not None and not 0 <= options.seed < 2**32:
        raise TunerError(f"--seed must be between 0 and {2**32 - 1}, got {options.seed}")
    check_window(*options.window, options.causal)
    check_softcap(options.softcap)
    if (options.window != (-1, -1) or options.softcap) and not options.shapes:
        raise TunerError("--window and --softcap describe --shape problems: pass --shape (a profile's default "
                         "problems have neither)")
    if options.heads_kv is not None and options.heads_kv < 1:
        raise TunerError(f"--hkv must be a positive integer, got {options.heads_kv}")
    if options.confirm < 0 or options.confirm_rounds < 1:
        raise TunerError("--confirm must be 0 or more and --confirm-rounds at least 1")
    if options.trials is not None and options.trials < 1:
        raise TunerError(f"--trials must be a positive integer, got {options.trials}")
    if options.early_stop is not None and options.early_stop < 1:
        raise TunerError(f"--early-stop must be a positive number of trials, got {options.early_stop}")
    if options.time_budget_s is not None and options.time_budget_s <= 0:
        raise TunerError("--time-budget must be positive")
    if not options.devices or len(set(options.devices)) != len(options.devices):
        raise TunerError("--devices must list distinct device indices, e.g. 0,1")
    if options.backend == "replay" and options.devices != tuple(range(len(options.devices))):
        # A replay measures on no card: --devices 5 would run as if card 5 were there, whether or not it is.
        devices = ",".join(map(str, options.devices))
        raise TunerError(f"--devices {devices}: the replay backend uses no GPU; --devices only sets how many replay "
                         f"workers run, numbered from 0 (e.g. --devices 0,1 for two)")
    check_replay_source(options.backend, options.replay_from)
