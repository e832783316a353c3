"""drift without false alarms: findings held back per node, the last applied configuration

Revision ID: 0007
Revises: 0006

``node_drift.held``: findings a round saw but did not report (the fabric settling after an
apply, or a VTEP finding seen in one round only). ``applied_config``: the configuration the
last apply gave the nodes (one row), what drift checks while an edit is pending.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.add_column("node_drift", sa.Column("held", sa.JSON(), nullable=False, server_default="[]"), schema=S)
    op.create_table(
        "applied_config",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("applied_config", schema=S)
    op.drop_column("node_drift", "held", schema=S)
