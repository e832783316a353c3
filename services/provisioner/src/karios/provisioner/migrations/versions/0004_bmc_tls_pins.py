"""BMC TLS pins: the certificate fingerprint each BMC presented on first contact

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "bmc_tls_pins",
        sa.Column("bmc_ip", sa.String(64), primary_key=True),
        sa.Column("fingerprint", sa.String(95), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("bmc_tls_pins", schema=S)
