"""admission control: when a job was admitted to its BMC/media work (counted over all replicas)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True), schema=S)
    # Admission reads the worker-phase jobs only: the queue (oldest first) and the admitted ones.
    op.create_index(
        "ix_jobs_admission",
        "jobs",
        ["created_at"],
        schema=S,
        postgresql_where=sa.text("state IN ('queued', 'building_media', 'mounting')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_admission", table_name="jobs", schema=S)
    op.drop_column("jobs", "admitted_at", schema=S)
