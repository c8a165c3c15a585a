"""Optuna's journal inside the results store (it was a separate file next to a SQLite store).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0003"
down_revision: Union[str, None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "optuna_journal",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("log", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_optuna_journal"),
    )


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade). On a SQLite store
# the journal holds every Optuna study: without it a resume finds trials of studies that do not exist.
LOSES = {"Optuna journal records": "SELECT COUNT(*) FROM optuna_journal"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    op.drop_table("optuna_journal")
