"""Problems may be FP8: dtype "e4m3" (fp8 q, k, v with float32 descales per batch row and K/V head, a bf16
output). The dtype column (String(16)) holds it as it is: no table changes, only a revision that an older
tuner does not know, so that it refuses a store it would misread.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from typing import Sequence, Union

from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0009"
down_revision: Union[str, None] = "0008"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    pass  # the dtype column takes "e4m3" already


# What going below 0009 would leave unreadable: refused while any is there (tuner.store.downgrade). A tuner
# of 0008 knows fp16 and bf16 only; its problems (and their trials) would be rows it cannot load.
LOSES = {"problems in e4m3, which an older tuner cannot read (problems.dtype)":
         "SELECT COUNT(*) FROM problems WHERE dtype = 'e4m3'"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
