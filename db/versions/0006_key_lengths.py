"""Problems gain a key-length distribution: "full" (every row uses all Sk keys, what every earlier
problem was) or "uniform:LO" (a ragged decode batch); it is part of a problem's identity.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

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


def downgrade() -> None:
    # Ragged problems have no place in the old schema: refuse rather than merge them into full ones.
    bind = op.get_bind()
    ragged = bind.execute(sa.text("SELECT COUNT(*) FROM problems WHERE lengths != 'full'")).scalar()
    if ragged:
        raise RuntimeError(f"{ragged} problem(s) with a key-length distribution cannot go back to revision 0005")
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", SHAPE)
        batch.drop_column("lengths")
