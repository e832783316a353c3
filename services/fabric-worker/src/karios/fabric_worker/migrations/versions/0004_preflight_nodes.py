"""fabric config: what the last preflight saw of each node (the apply judges against it)

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.add_column(
        "fabric_config",
        sa.Column("preflight_nodes", sa.JSON(), nullable=False, server_default="[]"),
        schema=S,
    )


def downgrade() -> None:
    op.drop_column("fabric_config", "preflight_nodes", schema=S)
