"""provision jobs

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_type", sa.String(32), nullable=False),
        sa.Column("parent_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("bmc_ip", sa.String(64), nullable=False, index=True),
        sa.Column("vendor", sa.String(32), nullable=False, server_default=""),
        sa.Column("hostname", sa.String(255), nullable=False, server_default=""),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("percent", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("token_hash", sa.String(64), nullable=False, server_default=""),
        sa.Column("os_ip", sa.String(64), nullable=False, server_default=""),
        sa.Column("os_password_enc", sa.Text(), nullable=True),
        sa.Column("stage_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("jobs", schema=S)
