"""fabric config, VTEP allocations, switch ack audit

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.create_table(
        "fabric_config",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("bgp_password_enc", sa.String()),
        sa.Column("ospf_auth_key_enc", sa.String()),
        sa.Column("rollout_status", sa.String(), nullable=False, server_default=""),
        sa.Column("frr_hmac_sha_capable", sa.Boolean()),
        sa.Column("underlay_mtu", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="fabric_config_singleton"),
        schema=S,
    )
    op.create_table(
        "vtep_allocations",
        sa.Column("vtep_ip", sa.String(64), primary_key=True),
        sa.Column("node_ip", sa.String(64), nullable=False, unique=True),
        sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("allocated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "switch_ack_audit",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acked_by", sa.String(), nullable=False),
        sa.Column("caller", sa.String(), nullable=False),
        sa.Column("caller_role", sa.String(), nullable=False),
        sa.Column("switch_nos", sa.String(), nullable=False),
        sa.Column("switch_snippet_hash", sa.String(), nullable=False),
        sa.Column("old_range", sa.String(), nullable=False),
        sa.Column("new_range", sa.String(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False, server_default=sa.false()),
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
    for t in ("processed_messages", "switch_ack_audit", "vtep_allocations", "fabric_config"):
        op.drop_table(t, schema=S)
