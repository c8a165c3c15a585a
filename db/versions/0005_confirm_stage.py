"""The confirm stage: the best variants re-timed against the baselines in interleaved rounds.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0005"
down_revision: Union[str, None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "confirmations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("baseline_impl", sa.String(), nullable=True),
        sa.Column("winner_trial_id", sa.Integer(), nullable=False),
        sa.Column("winner_us", sa.Float(), nullable=False),
        sa.Column("winner_ratio", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_confirmations_run_id_runs"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], name="fk_confirmations_problem_id_problems"),
        sa.ForeignKeyConstraint(["winner_trial_id"], ["trials.id"], name="fk_confirmations_winner_trial_id_trials"),
        sa.PrimaryKeyConstraint("id", name="pk_confirmations"),
    )
    op.create_index("ix_confirmations_run_id", "confirmations", ["run_id"])
    op.create_index("ix_confirmations_problem_id", "confirmations", ["problem_id"])
    op.create_table(
        "confirm_timings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("confirmation_id", sa.Integer(), nullable=False),
        sa.Column("impl", sa.String(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("median_us", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["confirmation_id"], ["confirmations.id"],
                                name="fk_confirm_timings_confirmation_id_confirmations"),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], name="fk_confirm_timings_trial_id_trials"),
        sa.PrimaryKeyConstraint("id", name="pk_confirm_timings"),
    )
    op.create_index("ix_confirm_timings_confirmation_id", "confirm_timings", ["confirmation_id"])


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade).
LOSES = {"confirmations": "SELECT COUNT(*) FROM confirmations", "confirm timings": "SELECT COUNT(*) FROM confirm_timings"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    op.drop_table("confirm_timings")
    op.drop_table("confirmations")
