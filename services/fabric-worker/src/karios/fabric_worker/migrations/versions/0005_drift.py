"""drift detection: the last check of each node and the one-replica-per-round lease

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.create_table(
        "node_drift",
        sa.Column("node_ip", sa.String(64), primary_key=True),
        sa.Column("fqdn", sa.String(), nullable=False, server_default=""),
        sa.Column("drifted", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("findings", sa.JSON(), nullable=False, server_default="[]"),
        sa.Column("frr_config_sha256", sa.String(), nullable=False, server_default=""),
        sa.Column("intent_sha256", sa.String(), nullable=False, server_default=""),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "drift_round",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False, server_default=""),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        schema=S,
    )
    op.execute("INSERT INTO fabric.drift_round (id) VALUES (1)")


def downgrade() -> None:
    op.drop_table("drift_round", schema=S)
    op.drop_table("node_drift", schema=S)
