"""ORM models of the results store (SQLAlchemy 2.0 declarative style).

The schema is owned by the Alembic migrations in db/versions; these models must
match them exactly (tests/test_store_migrations.py compares the two).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, composite, mapped_column

from tuner.runtime.timed import Timing
from tuner.status import TrialStatus

# Deterministic constraint names, so that migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUS_TYPE = Enum(
    TrialStatus,
    name="status",
    native_enum=False,
    create_constraint=True,
    length=16,
    values_callable=lambda enum: [member.value for member in enum],
    validate_strings=True,
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def timing_composite() -> Any:
    """A table's Timing, mapped to its Timing.COLUMNS (NULL median: no timing, a failed trial's row)."""
    return composite(Timing.from_columns, *Timing.COLUMNS)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RunTable(Base):
    """One invocation of the tuner on one GPU (search, baseline or profile session)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String)
    gpu_uuid: Mapped[Optional[str]] = mapped_column(String)
    profile: Mapped[str] = mapped_column(String, index=True)
    driver: Mapped[Optional[str]] = mapped_column(String)
    cuda_version: Mapped[Optional[str]] = mapped_column(String)
    torch_version: Mapped[Optional[str]] = mapped_column(String)
    tuner_version: Mapped[Optional[str]] = mapped_column(String)
    host: Mapped[Optional[str]] = mapped_column(String)
    command_line: Mapped[Optional[str]] = mapped_column(Text)
    # The recording a replayed run answered from (`--backend replay`): its numbers were not measured here.
    replayed_from: Mapped[Optional[str]] = mapped_column(String)
    objective: Mapped[Optional[str]] = mapped_column(String(16))  # what its searches minimized (NULL: time)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class ProblemTable(Base):
    """An attention problem; one row per distinct shape/dtype/mask/layout/key lengths/window/softcap/pass."""

    __tablename__ = "problems"
    __table_args__ = (
        UniqueConstraint(
            "batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim", "dtype", "causal", "layout", "lengths",
            "window_left", "window_right", "softcap", "pass", name="uq_problems_shape",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    heads_kv: Mapped[int] = mapped_column(Integer)
    seq_q: Mapped[int] = mapped_column(Integer)
    seq_k: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    causal: Mapped[bool] = mapped_column(Boolean)
    layout: Mapped[str] = mapped_column(String(16))
    lengths: Mapped[str] = mapped_column(String(32), server_default="full")  # Problem.lengths: full or uniform:LO
    window_left: Mapped[int] = mapped_column(Integer, server_default="-1")  # Problem.window_left; -1 unbounded
    window_right: Mapped[int] = mapped_column(Integer, server_default="-1")
    softcap: Mapped[float] = mapped_column(Float, server_default="0")  # Problem.softcap; 0 off
    # Problem.kernel_pass: forward or backward (the column is `pass`, a Python keyword)
    kernel_pass: Mapped[str] = mapped_column("pass", String(16), server_default="forward")


class VariantTable(Base):
    """A template instantiated with frozen parameters.

    params_key is the canonical JSON text of params (sorted keys, no spaces):
    the uniqueness key, since JSON columns cannot be compared portably.
    """

    __tablename__ = "variants"
    __table_args__ = (UniqueConstraint("template", "template_hash", "params_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    template: Mapped[str] = mapped_column(String, index=True)
    template_hash: Mapped[str] = mapped_column(String)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    params_key: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String)


class TrialTable(Base):
    """One evaluated variant on one problem in one run; failures are rows too."""

    __tablename__ = "trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), index=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"), index=True)
    study: Mapped[Optional[str]] = mapped_column(String)
    trial_number: Mapped[Optional[int]] = mapped_column(Integer)
    status: Mapped[TrialStatus] = mapped_column(STATUS_TYPE, index=True)
    median_us: Mapped[Optional[float]] = mapped_column(Float)
    p20_us: Mapped[Optional[float]] = mapped_column(Float)
    p80_us: Mapped[Optional[float]] = mapped_column(Float)
    tflops: Mapped[Optional[float]] = mapped_column(Float)
    rel_error: Mapped[Optional[float]] = mapped_column(Float)
    compile_s: Mapped[Optional[float]] = mapped_column(Float)
    registers: Mapped[Optional[int]] = mapped_column(Integer)
    smem_bytes: Mapped[Optional[int]] = mapped_column(Integer)
    spill_bytes: Mapped[Optional[int]] = mapped_column(Integer)
    cubin_sha256: Mapped[Optional[str]] = mapped_column(String(64))
    error: Mapped[Optional[str]] = mapped_column(Text)
    compile_log: Mapped[Optional[str]] = mapped_column(Text)
    source_path: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    joules_per_call: Mapped[Optional[float]] = mapped_column(Float)  # tuner.runtime.energy.Energy
    power_w: Mapped[Optional[float]] = mapped_column(Float)
    sm_mhz: Mapped[Optional[float]] = mapped_column(Float)
    isolated_us: Mapped[Optional[float]] = mapped_column(Float)  # median of isolated calls (--objective isolated)
    # Energy columns NULL: not metered (a trial of a search with another objective than energy), or no NVML.
    timing: Mapped[Optional[Timing]] = timing_composite()


class BaselineTable(Base):
    """A reference implementation (torch SDPA backend) timed in the same run."""

    __tablename__ = "baselines"
    __table_args__ = (Index("ix_baselines_run_id_problem_id", "run_id", "problem_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    impl: Mapped[str] = mapped_column(String)
    median_us: Mapped[float] = mapped_column(Float)
    p20_us: Mapped[Optional[float]] = mapped_column(Float)
    p80_us: Mapped[Optional[float]] = mapped_column(Float)
    tflops: Mapped[Optional[float]] = mapped_column(Float)
    joules_per_call: Mapped[Optional[float]] = mapped_column(Float)
    power_w: Mapped[Optional[float]] = mapped_column(Float)
    sm_mhz: Mapped[Optional[float]] = mapped_column(Float)
    isolated_us: Mapped[Optional[float]] = mapped_column(Float)
    timing: Mapped[Timing] = timing_composite()


class NcuMetricTable(Base):
    """One Nsight Compute counter of one trial's kernel."""

    __tablename__ = "ncu_metrics"
    __table_args__ = (UniqueConstraint("trial_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    name: Mapped[str] = mapped_column(String)
    value: Mapped[float] = mapped_column(Float)
    unit: Mapped[Optional[str]] = mapped_column(String)


class OptunaJournalTable(Base):
    """Optuna's journal of the studies searched into this store (SQLite stores): one JSON log per row,
    in order. Keeping it here makes a store one file to back up or copy, and each append one
    transaction, so a full disk or a killed process never leaves half a record."""

    __tablename__ = "optuna_journal"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    log: Mapped[str] = mapped_column(Text)


class ConfirmationTable(Base):
    """A confirm stage: the best variants of a problem re-timed against the baselines in interleaved rounds;
    the winner has the best median per-round ratio to the fastest baseline."""

    __tablename__ = "confirmations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), index=True)
    rounds: Mapped[int] = mapped_column(Integer)
    baseline_impl: Mapped[Optional[str]] = mapped_column(String)
    winner_trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    winner_us: Mapped[float] = mapped_column(Float)  # median over the rounds
    winner_ratio: Mapped[Optional[float]] = mapped_column(Float)  # median per-round baseline µs / winner µs
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # What it ranked by (NULL: time); with energy, winner_ratio is the median per-round ratio of J per call.
    objective: Mapped[Optional[str]] = mapped_column(String(16))
    winner_joules_per_call: Mapped[Optional[float]] = mapped_column(Float)  # median over the rounds


class ConfirmTimingTable(Base):
    """One implementation's median µs in one round of a confirm stage (trial_id: a variant; else a baseline)."""

    __tablename__ = "confirm_timings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    confirmation_id: Mapped[int] = mapped_column(ForeignKey("confirmations.id"), index=True)
    impl: Mapped[str] = mapped_column(String)
    trial_id: Mapped[Optional[int]] = mapped_column(ForeignKey("trials.id"))
    round: Mapped[int] = mapped_column(Integer)
    median_us: Mapped[float] = mapped_column(Float)
    joules_per_call: Mapped[Optional[float]] = mapped_column(Float)
    power_w: Mapped[Optional[float]] = mapped_column(Float)
    sm_mhz: Mapped[Optional[float]] = mapped_column(Float)
    isolated_us: Mapped[Optional[float]] = mapped_column(Float)
