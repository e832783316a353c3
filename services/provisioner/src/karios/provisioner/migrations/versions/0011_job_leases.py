"""worker leases in a narrow table of their own: a heartbeat no longer rewrites job rows

The heartbeat renews the lease of every job a replica works, queued ones included, every
lease_seconds/3. In ``jobs`` each renewal wrote a whole new version of the job's wide row (its
spec, ~1.2 KB) and, ``lease_until`` being indexed, a new entry in every index of the table: a
3,000-host storm left 56,530 dead job-row versions (18.8 KiB of table per host against 7.8 at
1,000 hosts; 71 KiB per host at 10,000) and the renewals' cost grew with the queue's wait.
``job_leases`` holds one narrow row per worker-phase job; it has no index but its key, and room
on each page (fillfactor 50), so a renewal is a heap-only update PostgreSQL prunes in place.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
S = "provision"
_WORK = "('queued', 'building_media', 'mounting')"


def upgrade() -> None:
    op.create_table(
        "job_leases",
        sa.Column("job_id", sa.String(64), sa.ForeignKey(f"{S}.jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        schema=S,
        postgresql_with={"fillfactor": 50},
    )
    # A handed-back or never-leased worker-phase job is claimable at once: '-infinity'.
    op.execute(
        f"INSERT INTO {S}.job_leases (job_id, lease_until) "
        f"SELECT id, coalesce(lease_until, '-infinity') FROM {S}.jobs WHERE state IN {_WORK}"
    )
    op.drop_index("ix_jobs_worker_lease", table_name="jobs", schema=S)
    op.drop_column("jobs", "lease_until", schema=S)


def downgrade() -> None:
    op.add_column("jobs", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True), schema=S)
    op.execute(
        f"UPDATE {S}.jobs j SET lease_until = nullif(l.lease_until, '-infinity') "
        f"FROM {S}.job_leases l WHERE l.job_id = j.id"
    )
    op.create_index(
        "ix_jobs_worker_lease",
        "jobs",
        ["lease_until"],
        schema=S,
        postgresql_where=sa.text(f"state IN {_WORK}"),
    )
    op.drop_table("job_leases", schema=S)
