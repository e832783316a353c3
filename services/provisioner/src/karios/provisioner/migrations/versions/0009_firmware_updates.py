"""firmware updates through the BMC (issue 27 item 5): one row per update, its view as JSON

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "firmware_updates",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("bmc_ip", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        schema=S,
    )
    op.create_index("ix_firmware_updates_bmc_ip", "firmware_updates", ["bmc_ip"], schema=S)


def downgrade() -> None:
    op.drop_table("firmware_updates", schema=S)
