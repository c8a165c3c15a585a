"""Problems gain a sliding window (window_left, window_right; -1 unbounded, FlashAttention's window_size)
and a logit softcap (0: off); both are part of a problem's identity.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0008"
down_revision: Union[str, None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

SHAPE = ["batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim", "dtype", "causal", "layout", "lengths"]
ADDED = ["window_left", "window_right", "softcap"]


def upgrade() -> None:
    # batch mode: SQLite cannot alter a constraint in place (the table is copied, rows and ids kept).
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("window_left", sa.Integer(), nullable=False, server_default="-1"))
        batch.add_column(sa.Column("window_right", sa.Integer(), nullable=False, server_default="-1"))
        batch.add_column(sa.Column("softcap", sa.Float(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + ADDED)


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade). A windowed or softcapped
# problem has no place in the old schema; every earlier problem (no window, no softcap) loses nothing.
LOSES = {"problems with a sliding window or a softcap (problems.window_left, window_right, softcap)":
         "SELECT COUNT(*) FROM problems WHERE window_left != -1 OR window_right != -1 OR softcap != 0"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        for column in reversed(ADDED):
            batch.drop_column(column)
