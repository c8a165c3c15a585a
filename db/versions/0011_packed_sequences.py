"""Problems may be packed sequences: layout "packed" (a batch of sequences one after another in [total, H, D]
tensors with cumulative lengths, FlashAttention's varlen form; each sequence's length from the problem's
length distribution). The layout column (String(16)) holds the name as it is: no table changes, only a
revision that an older tuner does not know, so that it refuses a store it would misread.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from typing import Sequence, Union

from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0011"
down_revision: Union[str, None] = "0010"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    pass  # the layout column takes the new name already


# What going below 0011 would leave unreadable: refused while any is there (tuner.store.downgrade). A tuner
# of 0010 knows dense and paged layouts only; its problems (and their trials) would be rows it cannot load.
LOSES = {"problems of packed sequences, which an older tuner cannot read (problems.layout)":
         "SELECT COUNT(*) FROM problems WHERE layout = 'packed'"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
