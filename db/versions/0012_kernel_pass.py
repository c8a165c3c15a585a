"""Problems gain a pass (`pass`: forward, or backward for dQ, dK, dV), part of a problem's identity: a problem's
backward is tuned in studies of its own and timed against backward baselines. Every earlier problem is a forward.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0012"
down_revision: Union[str, None] = "0011"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

SHAPE = ["batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim", "dtype", "causal", "layout", "lengths",
         "window_left", "window_right", "softcap"]


def upgrade() -> None:
    # batch mode: SQLite cannot alter a constraint in place (the table is copied, rows and ids kept).
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("pass", sa.String(16), nullable=False, server_default="forward"))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + ["pass"])


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade). A backward problem has no
# place in the old schema (it would read as the forward of the same shape).
LOSES = {"problems of the backward pass (problems.pass)": "SELECT COUNT(*) FROM problems WHERE pass != 'forward'"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        batch.drop_column("pass")
