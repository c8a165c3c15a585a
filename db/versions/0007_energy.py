"""Energy beside time: each timing (trials, baselines, confirm-stage rounds) gains the joules per call,
mean board power and mean SM clock of its timed block, and the median µs of isolated calls (--objective
isolated); runs and confirm stages record the objective they were searched or ranked by, and a confirm
stage its winner's median J per call.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0007"
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


_MEASURED = " OR ".join(f"{column} IS NOT NULL" for column in FIGURES)
# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade). The old schema holds
# every other figure as it was (median_us is the back-to-back time in both), and an objective of "time" is
# what every older run and confirm stage meant; energy figures, isolated timings and other objectives are lost.
LOSES = {
    **{f"energy or isolated figures of {table}": f"SELECT COUNT(*) FROM {table} WHERE {_MEASURED}" for table in TIMED},
    "runs of another objective than time (runs.objective)":
        "SELECT COUNT(*) FROM runs WHERE objective IS NOT NULL AND objective != 'time'",
    "confirm stages of another objective than time, or with the winner's J per call":
        "SELECT COUNT(*) FROM confirmations WHERE (objective IS NOT NULL AND objective != 'time') "
        "OR winner_joules_per_call IS NOT NULL",
}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    with op.batch_alter_table("confirmations") as batch:
        batch.drop_column("winner_joules_per_call")
        batch.drop_column("objective")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("objective")
    for table in reversed(TIMED):
        with op.batch_alter_table(table) as batch:
            for column in reversed(FIGURES):
                batch.drop_column(column)
