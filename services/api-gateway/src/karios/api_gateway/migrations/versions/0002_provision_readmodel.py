"""provisioning read model: jobs and provision_progresses

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "gateway"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_type", sa.String(32), nullable=False),
        sa.Column("job_status", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("node_ip", sa.String(64), nullable=False, server_default=""),
        sa.Column("bmc_ip", sa.String(64), nullable=False, server_default="", index=True),
        sa.Column("parent_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("progress", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("resource_name", sa.String(255), nullable=False, server_default=""),
        sa.Column("total_jobs", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "provision_progresses",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("bmc_ip", sa.String(64), nullable=False, index=True),
        sa.Column("job_id", sa.String(64), nullable=False, index=True),
        sa.Column("stage", sa.String(64), nullable=False),
        sa.Column("percent_complete", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("provision_progresses", schema=S)
    op.drop_table("jobs", schema=S)
