"""Runs say whether they were replayed from a recording (and from which).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0004"
down_revision: Union[str, None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("replayed_from", sa.String(), nullable=True))


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade).
LOSES = {"replay sources of runs (runs.replayed_from)": "SELECT COUNT(*) FROM runs WHERE replayed_from IS NOT NULL"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("replayed_from")
