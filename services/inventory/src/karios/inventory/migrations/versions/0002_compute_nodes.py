"""compute nodes: adopted by OS address or registered at first boot

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "inventory"


def upgrade() -> None:
    op.create_table(
        "compute_nodes",
        sa.Column("node_ip", sa.String(64), primary_key=True),
        sa.Column("bmc_ip", sa.String(64), index=True),
        sa.Column("hostname", sa.String(253)),
        sa.Column("ssh_port", sa.Integer(), nullable=False, server_default="22"),
        sa.Column("os_username", sa.String(128), nullable=False, server_default="root"),
        sa.Column("os_password_enc", sa.String()),
        sa.Column("ssh_private_key_enc", sa.String()),
        sa.Column("host_key", sa.String()),
        sa.Column("host_key_fingerprint", sa.String(128)),
        sa.Column("source", sa.String(16), nullable=False, server_default="adopted"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("compute_nodes", schema=S)
