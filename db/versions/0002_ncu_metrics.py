"""Nsight Compute counters per trial.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0002"
down_revision: Union[str, None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "ncu_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], name="fk_ncu_metrics_trial_id_trials"),
        sa.PrimaryKeyConstraint("id", name="pk_ncu_metrics"),
        sa.UniqueConstraint("trial_id", "name", name="uq_ncu_metrics_trial_id_name"),
    )


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade).
LOSES = {"ncu metrics": "SELECT COUNT(*) FROM ncu_metrics"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    op.drop_table("ncu_metrics")
