"""admission reads only what it decides on: the admitted jobs and each vendor's oldest queued

An admission round runs each time a job starts waiting or leaves the admitted states (~2 per
job) and counted the admitted jobs and ranked every queued job (a window over the whole queue)
through ``ix_jobs_admission``, which holds every worker-phase job: a round's cost grew with the
queue, a storm's with its square. These partial indexes hold the admitted jobs (at most the
overall limit) and the waiting ones by vendor, oldest first: the round reads each vendor's first
rows (a skip scan over the vendors) and the admitted ones, whatever the queue's length.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_admitted",
        "jobs",
        ["vendor", "owner"],
        schema=S,
        postgresql_where=sa.text(
            "admitted_at IS NOT NULL AND state IN ('queued', 'building_media', 'mounting')"
        ),
    )
    op.create_index(
        "ix_jobs_waiting",
        "jobs",
        ["vendor", "created_at", "id"],
        schema=S,
        postgresql_where=sa.text("state = 'queued' AND admitted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_waiting", table_name="jobs", schema=S)
    op.drop_index("ix_jobs_admitted", table_name="jobs", schema=S)
