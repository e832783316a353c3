"""fabric rollout: job summaries, first-seen host keys, preflight underlay on the config

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.add_column(
        "fabric_config", sa.Column("underlay_cidr", sa.String(), nullable=False, server_default=""), schema=S
    )
    op.add_column(
        "fabric_config", sa.Column("node_overrides", sa.JSON(), nullable=False, server_default="[]"), schema=S
    )
    op.create_table(
        "fabric_jobs",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("job_type", sa.String(32), nullable=False),
        sa.Column("job_status", sa.String(32), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "node_host_keys",
        sa.Column("node_ip", sa.String(64), primary_key=True),
        sa.Column("host_key", sa.String(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("node_host_keys", schema=S)
    op.drop_table("fabric_jobs", schema=S)
    op.drop_column("fabric_config", "node_overrides", schema=S)
    op.drop_column("fabric_config", "underlay_cidr", schema=S)
