"""Plain records passed into and out of the store (no ORM object leaves the store)."""

from __future__ import annotations

import json
import math
import shlex
import socket
import sys
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import Enum
from typing import Any, Mapping, Optional

from tuner.errors import TunerError
from tuner.problem import DTYPES, PASSES, Problem
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timed, Timing
from tuner.status import TrialStatus
from tuner.store.redact import redact_command_line


def canonical_json(params: Mapping[str, Any]) -> str:
    """The canonical text of a params dict: sorted keys, no spaces, ASCII only."""
    try:
        return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TunerError(f"variant params must be a JSON object of finite values: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """Where and with what a run happened (one row of `runs`)."""

    gpu_name: str
    profile: str
    gpu_uuid: Optional[str] = None
    driver: Optional[str] = None
    cuda_version: Optional[str] = None
    torch_version: Optional[str] = None
    tuner_version: Optional[str] = None
    host: Optional[str] = None
    command_line: Optional[str] = None
    replayed_from: Optional[str] = None  # URL (secrets hidden) of the recording a replayed run answered from
    objective: Optional[str] = None  # what the run's searches minimized (tuner.runtime.objective; None: time)

    @classmethod
    def for_this_process(cls, *, gpu_name: str, profile: str, **gpu_facts: Optional[str]) -> "RunInfo":
        """Fill host, versions and command line from the current process."""
        from importlib.metadata import PackageNotFoundError, version

        import tuner

        try:
            torch_version: Optional[str] = version("torch")
        except PackageNotFoundError:
            torch_version = None
        return cls(
            gpu_name=gpu_name,
            profile=profile,
            torch_version=torch_version,
            tuner_version=tuner.__version__,
            host=socket.gethostname(),
            command_line=shlex.join(redact_command_line(sys.argv)),  # runs are printed in reports
            **gpu_facts,
        )


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One trial to store; problem and variant rows are found or created with it."""

    run_id: int
    problem: Problem
    template: str
    template_hash: str
    params: Mapping[str, Any]
    variant_name: str
    status: TrialStatus
    study: Optional[str] = None
    trial_number: Optional[int] = None
    timing: Optional[Timing] = None  # what the GPU worker measured, kept whole (None: not timed)
    tflops: Optional[float] = None  # computed from problem and the timing's median when left out
    rel_error: Optional[float] = None
    compile_s: Optional[float] = None
    registers: Optional[int] = None
    smem_bytes: Optional[int] = None
    spill_bytes: Optional[int] = None
    cubin_sha256: Optional[str] = None
    error: Optional[str] = None
    compile_log: Optional[str] = None
    source_path: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class BaselineRecord:
    """A baseline implementation timed in the same run and process."""

    run_id: int
    problem: Problem
    impl: str
    timing: Timing
    tflops: Optional[float] = None  # computed from problem and the timing's median when left out


@dataclass(frozen=True)
class NcuMetric:
    name: str
    value: float
    unit: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class TrialFilter:
    """What `query_trials`/`best_trials` select; None means "any"."""

    gpu: Optional[str] = None  # runs.profile exactly, or a case-insensitive substring of runs.gpu_name
    shape: Optional[tuple[int, int, int, int, int]] = None  # (B, H, Sq, Sk, D)
    problem: Optional[Problem] = None  # exactly this problem (every field: heads_kv and layout too)
    dtype: Optional[str] = None
    causal: Optional[bool] = None
    kernel_pass: Optional[str] = None  # forward or backward (Problem.kernel_pass)
    template: Optional[str] = None
    template_hashes: Optional[tuple[str, ...]] = None  # variants of these template code versions only
    status: Optional[TrialStatus] = None
    run_id: Optional[int] = None
    study: Optional[str] = None
    trial_number: Optional[int] = None  # the Optuna trial number within `study`
    limit: Optional[int] = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise TunerError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.kernel_pass is not None and self.kernel_pass not in PASSES:
            raise TunerError(f"unknown pass {self.kernel_pass!r}; expected one of {', '.join(PASSES)}")
        if self.status is not None:
            object.__setattr__(self, "status", TrialStatus.parse(self.status))
        if self.shape is not None:
            if len(self.shape) == 4:
                b, h, s, d = self.shape
                object.__setattr__(self, "shape", (b, h, s, s, d))
            elif len(self.shape) != 5:
                raise TunerError(f"shape filter must have 4 or 5 numbers, got {self.shape!r}")
        if self.limit is not None and self.limit < 1:
            raise TunerError(f"limit must be a positive integer, got {self.limit}")


@dataclass(frozen=True, kw_only=True)
class BaselineRow(Timed):
    id: int
    run_id: int
    problem_id: int
    impl: str
    timing: Timing
    tflops: Optional[float]

    @property
    def tflops_per_watt(self) -> Optional[float]:
        return self.energy.tflops_per_watt(self.tflops) if self.energy else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            out.update(timing_fields(self.timing) if f.name == "timing" else {f.name: getattr(self, f.name)})
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (Problem, Energy)):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


def timing_fields(timing: Optional[Timing]) -> dict[str, Any]:
    """A timing's figures as the JSON and CSV of rows have always shown them: flat, beside the row's other
    fields, the energy a dict (the repetitions are not stored)."""
    t = timing
    return {"median_us": t.median_us if t else None, "p20_us": t.p20_us if t else None,
            "p80_us": t.p80_us if t else None, "energy": asdict(t.energy) if t and t.energy else None,
            "isolated_us": t.isolated_us if t else None}


@dataclass(frozen=True, kw_only=True)
class TrialRow(Timed):
    """A stored trial with its problem, variant, GPU and ratio to the best baseline."""

    id: int
    run_id: int
    problem_id: int
    variant_id: int
    problem: Problem
    template: str
    template_hash: str
    variant_name: str
    params: dict[str, Any]
    study: Optional[str]
    trial_number: Optional[int]
    status: TrialStatus
    timing: Optional[Timing]  # None: not timed (a failed trial)
    tflops: Optional[float]
    rel_error: Optional[float]
    compile_s: Optional[float]
    registers: Optional[int]
    smem_bytes: Optional[int]
    spill_bytes: Optional[int]
    cubin_sha256: Optional[str]
    error: Optional[str]
    gpu_name: str
    profile: str
    created_at: datetime
    best_baseline_impl: Optional[str] = None
    best_baseline_us: Optional[float] = None
    # best_baseline_us / median_us: > 1 means the trial beats every baseline of its run.
    ratio_to_best_baseline: Optional[float] = None
    # Set on the confirmed winner of its problem (Store.prefer_confirmed): the confirm stage's figures.
    confirmed_us: Optional[float] = None  # median over the interleaved rounds
    confirmed_ratio: Optional[float] = None  # median per-round ratio to the fastest baseline
    confirmed_baseline: Optional[str] = None
    confirmed_joules_per_call: Optional[float] = None  # median over the interleaved rounds
    confirmed_objective: Optional[str] = None  # what confirmed_ratio compares (None: time)
    best_baseline_energy: Optional[Energy] = None
    replayed_from: Optional[str] = None  # its run's recording, when a replay answered it (None: measured)

    @property
    def headline_us(self) -> Optional[float]:
        """The figure to show: the confirmed one when there is one."""
        return self.confirmed_us if self.confirmed_us is not None else self.median_us

    @property
    def headline_ratio(self) -> Optional[float]:
        return self.confirmed_ratio if self.confirmed_us is not None else self.ratio_to_best_baseline

    @property
    def headline_joules(self) -> Optional[float]:
        """J per call: the confirm stage's median when it measured energy, else the trial's."""
        if self.confirmed_us is not None and self.confirmed_joules_per_call is not None:
            return self.confirmed_joules_per_call
        return self.energy.joules_per_call if self.energy else None

    @property
    def tflops_per_watt(self) -> Optional[float]:
        """TFLOP/s per watt of board power: the problem's TFLOP per headline joule (J per call is
        power x time, so this is TFLOP/s / W)."""
        joules = self.headline_joules
        return self.problem.flops * 1e-12 / joules if joules else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (problem nested, label added)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "timing":
                out.update({key: _jsonable(v) for key, v in timing_fields(value).items()})
            elif isinstance(value, list):
                out[f.name] = [item.to_dict() if hasattr(item, "to_dict") else _jsonable(asdict(item)) for item in value]
            elif isinstance(value, RunInfo):
                out[f.name] = asdict(value)
            else:
                out[f.name] = _jsonable(value)
        out["problem_label"] = self.problem.label
        return out

    CSV_FIELDS = (
        "id", "run_id", "gpu_name", "profile", "batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim",
        "dtype", "causal", "layout", "lengths", "window_left", "window_right", "softcap", "kernel_pass", "template",
        "variant_name",
        "params", "status", "median_us", "p20_us",
        "p80_us", "tflops", "ratio_to_best_baseline", "best_baseline_impl", "rel_error", "registers",
        "smem_bytes", "spill_bytes", "study", "trial_number", "created_at", "confirmed_us", "confirmed_ratio",
        "confirmed_baseline", "joules_per_call", "power_w", "sm_mhz", "isolated_us", "replayed_from",
    )  # fmt: skip

    def csv_row(self) -> dict[str, Any]:
        flat = self.to_dict()
        flat.update(flat.pop("problem"))
        flat.update(flat.pop("energy") or {})
        flat["params"] = canonical_json(self.params)
        return {name: flat.get(name) for name in self.CSV_FIELDS}


@dataclass(frozen=True, kw_only=True)
class TrialDetail(TrialRow):
    """Everything known about one trial (`tuner show`)."""

    compile_log: Optional[str] = None
    source_path: Optional[str] = None
    run: Optional[RunInfo] = None
    run_started_at: Optional[datetime] = None
    run_ended_at: Optional[datetime] = None
    ncu_metrics: list[NcuMetric] = field(default_factory=list)
    baselines: list[BaselineRow] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ConfirmRecord:
    """A confirm stage to store: per implementation (a variant's trial id, or None for a baseline)
    its median µs in each round, and the winner it chose."""

    run_id: int
    problem: Problem
    rounds: int
    timings: dict[str, tuple[Optional[int], tuple[float, ...]]]  # impl -> (trial id, µs per round)
    winner_trial_id: int
    winner_us: float
    winner_ratio: Optional[float]  # the median per-round ratio of the objective's figure
    baseline_impl: Optional[str]
    objective: str = "time"
    winner_joules_per_call: Optional[float] = None
    energy: dict[str, tuple[Optional[Energy], ...]] = field(default_factory=dict)  # aligned with timings
    isolated_us: dict[str, tuple[Optional[float], ...]] = field(default_factory=dict)  # aligned with timings


@dataclass(frozen=True, kw_only=True)
class ConfirmedRow:
    """The confirmed winner of a problem: what `results --best`, `show`, the summary and export prefer."""

    confirmation_id: int
    run_id: int
    problem: Problem
    trial_id: int
    variant_name: str
    median_us: float  # median over the confirm rounds
    ratio: Optional[float]  # median per-round ratio to the fastest baseline (> 1: the kernel is faster)
    baseline_impl: Optional[str]
    rounds: int
    objective: str = "time"  # what `ratio` compares: µs back to back, J per call, or µs of isolated calls
    joules_per_call: Optional[float] = None  # the winner's median over the rounds

