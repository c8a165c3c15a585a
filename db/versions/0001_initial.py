"""Initial results schema: runs, problems, variants, trials, baselines.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0001"
down_revision: Union[str, None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TRIAL_STATUSES = ("ok", "pruned", "compile_error", "launch_error", "timeout", "incorrect")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_name", sa.String(), nullable=False),
        sa.Column("gpu_uuid", sa.String(), nullable=True),
        sa.Column("profile", sa.String(), nullable=False),
        sa.Column("driver", sa.String(), nullable=True),
        sa.Column("cuda_version", sa.String(), nullable=True),
        sa.Column("torch_version", sa.String(), nullable=True),
        sa.Column("tuner_version", sa.String(), nullable=True),
        sa.Column("host", sa.String(), nullable=True),
        sa.Column("command_line", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_profile", "runs", ["profile"])

    op.create_table(
        "problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.Column("heads_kv", sa.Integer(), nullable=False),
        sa.Column("seq_q", sa.Integer(), nullable=False),
        sa.Column("seq_k", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("layout", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_problems"),
        sa.UniqueConstraint(
            "batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim", "dtype", "causal", "layout",
            name="uq_problems_shape",
        ),
    )  # fmt: skip

    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("template", sa.String(), nullable=False),
        sa.Column("template_hash", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("params_key", sa.Text(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_variants"),
        sa.UniqueConstraint("template", "template_hash", "params_key", name="uq_variants_template_template_hash_params_key"),
    )
    op.create_index("ix_variants_template", "variants", ["template"])

    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("variant_id", sa.Integer(), nullable=False),
        sa.Column("study", sa.String(), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("median_us", sa.Float(), nullable=True),
        sa.Column("p20_us", sa.Float(), nullable=True),
        sa.Column("p80_us", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("rel_error", sa.Float(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("smem_bytes", sa.Integer(), nullable=True),
        sa.Column("spill_bytes", sa.Integer(), nullable=True),
        sa.Column("cubin_sha256", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("compile_log", sa.Text(), nullable=True),
        sa.Column("source_path", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in TRIAL_STATUSES) + ")", name="ck_trials_status"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_trials_run_id_runs"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_trials_problem_id_problems"),
        sa.ForeignKeyConstraint(["variant_id"], ["variants.id"], name="fk_trials_variant_id_variants"),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
    )
    op.create_index("ix_trials_run_id", "trials", ["run_id"])
    op.create_index("ix_trials_problem_id", "trials", ["problem_id"])
    op.create_index("ix_trials_variant_id", "trials", ["variant_id"])
    op.create_index("ix_trials_status", "trials", ["status"])

    op.create_table(
        "baselines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("impl", sa.String(), nullable=False),
        sa.Column("median_us", sa.Float(), nullable=False),
        sa.Column("p20_us", sa.Float(), nullable=True),
        sa.Column("p80_us", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_baselines_run_id_runs"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_baselines_problem_id_problems"),
        sa.PrimaryKeyConstraint("id", name="pk_baselines"),
    )
    op.create_index("ix_baselines_run_id_problem_id", "baselines", ["run_id", "problem_id"])


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade).
LOSES = {name: f"SELECT COUNT(*) FROM {name}" for name in ("runs", "problems", "variants", "trials", "baselines")}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    op.drop_index("ix_baselines_run_id_problem_id", table_name="baselines")
    op.drop_table("baselines")
    for name in ("status", "variant_id", "problem_id", "run_id"):
        op.drop_index(f"ix_trials_{name}", table_name="trials")
    op.drop_table("trials")
    op.drop_index("ix_variants_template", table_name="variants")
    op.drop_table("variants")
    op.drop_table("problems")
    op.drop_index("ix_runs_profile", table_name="runs")
    op.drop_table("runs")
