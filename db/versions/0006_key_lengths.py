"""Problems gain a key-length distribution: "full" (every row uses all Sk keys, what every earlier
problem was) or "uniform:LO" (a ragged decode batch); it is part of a problem's identity.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0006"
down_revision: Union[str, None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

SHAPE = ["batch", "heads", "heads_kv", "seq_q", "seq_k", "head_dim", "dtype", "causal", "layout"]


def upgrade() -> None:
    # batch mode: SQLite cannot alter a constraint in place (the table is copied, rows and ids kept).
    with op.batch_alter_table("problems") as batch:
        batch.add_column(sa.Column("lengths", sa.String(32), nullable=False, server_default="full"))
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE + ["lengths"])


# What downgrade() deletes: refused while any of it is there (tuner.store.downgrade). Ragged problems have no
# place in the old schema (merging them into full ones would be wrong); "full", every earlier problem, loses nothing.
LOSES = {"problems with a key-length distribution (problems.lengths)":
         "SELECT COUNT(*) FROM problems WHERE lengths != 'full'"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        batch.drop_column("lengths")
