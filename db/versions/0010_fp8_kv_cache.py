"""Problems may have an FP8 KV cache: dtype "fp16_kv_e4m3" or "bf16_kv_e4m3" (q and the output in fp16 / bf16,
k and v float8_e4m3fn with float32 scales per batch row and K/V head, vLLM's k_scale / v_scale). The dtype
column (String(16)) holds them as they are: no table changes, only a revision that an older tuner does not
know, so that it refuses a store it would misread.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from typing import Sequence, Union

from alembic import op

from tuner.store.downgrade import refuse_losses

revision: str = "0010"
down_revision: Union[str, None] = "0009"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    pass  # the dtype column takes the new names already


# What going below 0010 would leave unreadable: refused while any is there (tuner.store.downgrade). A tuner
# of 0009 knows fp16, bf16 and e4m3 only; its problems (and their trials) would be rows it cannot load.
LOSES = {"problems with an FP8 KV cache, which an older tuner cannot read (problems.dtype)":
         "SELECT COUNT(*) FROM problems WHERE dtype IN ('fp16_kv_e4m3', 'bf16_kv_e4m3')"}


def downgrade() -> None:
    refuse_losses(op.get_bind(), down_revision, LOSES)
