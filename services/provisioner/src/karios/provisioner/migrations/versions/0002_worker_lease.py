"""worker lease: jobs survive a provisioner restart and are shared by replicas

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("owner", sa.String(128), nullable=False, server_default=""), schema=S)
    op.add_column("jobs", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True), schema=S)
    op.add_column("jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"), schema=S)
    op.add_column("jobs", sa.Column("token_enc", sa.Text(), nullable=True), schema=S)
    op.add_column("jobs", sa.Column("reset_at", sa.DateTime(timezone=True), nullable=True), schema=S)
    # The claim sweep: non-terminal worker-phase jobs by lease expiry.
    op.create_index(
        "ix_jobs_worker_lease",
        "jobs",
        ["lease_until"],
        schema=S,
        postgresql_where=sa.text("state IN ('queued', 'building_media', 'mounting')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_worker_lease", table_name="jobs", schema=S)
    for col in ("reset_at", "token_enc", "attempts", "lease_until", "owner"):
        op.drop_column("jobs", col, schema=S)
