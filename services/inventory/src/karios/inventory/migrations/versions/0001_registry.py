"""node registry and processed messages

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "inventory"


def upgrade() -> None:
    op.create_table(
        "bmc_infos",
        sa.Column("bmc_ip", sa.String(64), primary_key=True),
        sa.Column("bmc_username", sa.String()),
        sa.Column("bmc_password_enc", sa.String()),
        sa.Column("os_hostname", sa.String()),
        sa.Column("fqdn", sa.String()),
        sa.Column("os_ip", sa.String(), index=True),
        sa.Column("os_username", sa.String()),
        sa.Column("os_password_enc", sa.String()),
        sa.Column("primary_mac", sa.String()),
        sa.Column("serial_number", sa.String()),
        sa.Column("vendor", sa.String()),
        sa.Column("atlas_device_id", sa.Integer()),
        sa.Column("atlas_location_id", sa.Integer()),
        sa.Column("atlas_rack_id", sa.Integer()),
        sa.Column("atlas_site_id", sa.Integer()),
        sa.Column("is_control_node", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("ssh_host_key", sa.String()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "processed_messages",
        sa.Column("consumer", sa.String(200), primary_key=True),
        sa.Column("message_id", sa.String(64), primary_key=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("processed_messages", schema=S)
    op.drop_table("bmc_infos", schema=S)
