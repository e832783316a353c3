"""discovered servers: machines no host owned that PXE-booted the live environment in discovery
mode and reported their hardware (issue 27 item 3)

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "discovered_servers",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("boot_mac", sa.String(17), nullable=False, unique=True),
        sa.Column("serial", sa.String(256), nullable=False, server_default=""),
        sa.Column("status", sa.String(16), nullable=False, server_default="discovered"),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("report_count", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("digest", sa.String(64), nullable=False, server_default=""),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        schema=S,
    )
    op.create_index("ix_discovered_servers_serial", "discovered_servers", ["serial"], schema=S)
    op.create_index("ix_discovered_servers_last_seen", "discovered_servers", ["last_seen"], schema=S)


def downgrade() -> None:
    op.drop_table("discovered_servers", schema=S)
