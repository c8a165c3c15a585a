"""Energy beside time: each timing (trials, baselines, confirm-stage rounds) gains the joules per call,
mean board power and mean SM clock of its timed block, and the median µs of isolated calls (--objective
isolated); runs and confirm stages record the objective they were searched or ranked by, and a confirm
stage its winner's median J per call.

Revision ID: 0007_energy
Revises: 0006
Create Date: 2026-12-02
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007_energy"
down_revision: Union[str, None] = "0006"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIGURES = ("joules_per_call", "power_w", "sm_mhz", "isolated_us")
TIMED = ("trials", "baselines", "confirm_timings")


def upgrade() -> None:
    for table in TIMED:
        with op.batch_alter_table(table) as batch:
            for column in FIGURES:
                batch.add_column(sa.Column(column, sa.Float(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("objective", sa.String(16), nullable=True))
    with op.batch_alter_table("confirmations") as batch:
        batch.add_column(sa.Column("objective", sa.String(16), nullable=True))
        batch.add_column(sa.Column("winner_joules_per_call", sa.Float(), nullable=True))


def downgrade() -> None:
    # The old schema holds every other figure as it was (median_us is the back-to-back time in both):
    # going down loses the energy figures, the isolated timings and the objectives, nothing else.
    with op.batch_alter_table("confirmations") as batch:
        batch.drop_column("winner_joules_per_call")
        batch.drop_column("objective")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("objective")
    for table in reversed(TIMED):
        with op.batch_alter_table(table) as batch:
            for column in reversed(FIGURES):
                batch.drop_column(column)
