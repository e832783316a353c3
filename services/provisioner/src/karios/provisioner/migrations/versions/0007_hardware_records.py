"""hardware records: what each BMC reported at its last inspection; the power state each BMC
reported at the last power sync (issue 27)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "hardware_records",
        sa.Column("bmc_ip", sa.String(64), primary_key=True),
        sa.Column("inspected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("driver", sa.String(32), nullable=False, server_default=""),
        sa.Column("record", sa.JSON(), nullable=False),
        schema=S,
    )
    op.create_table(
        "bmc_power_states",
        sa.Column("bmc_ip", sa.String(64), primary_key=True),
        sa.Column("power_state", sa.String(32), nullable=False, server_default=""),
        sa.Column("health", sa.String(32), nullable=False, server_default=""),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("bmc_power_states", schema=S)
    op.drop_table("hardware_records", schema=S)
