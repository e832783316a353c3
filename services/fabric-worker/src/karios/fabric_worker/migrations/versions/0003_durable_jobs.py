"""fabric jobs across replicas: lease (owner + heartbeat), cancel flag, one running job at a time,
encrypted per-node baselines of an apply

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    op.add_column(
        "fabric_jobs", sa.Column("owner", sa.String(128), nullable=False, server_default=""), schema=S
    )
    op.add_column("fabric_jobs", sa.Column("heartbeat_at", sa.DateTime(timezone=True)), schema=S)
    op.add_column(
        "fabric_jobs",
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=S,
    )
    op.add_column(
        "fabric_jobs", sa.Column("request", sa.JSON(), nullable=False, server_default="{}"), schema=S
    )
    # Rows left "running" by a worker that died before this revision: nobody owns them any more.
    op.execute(
        "UPDATE fabric.fabric_jobs SET job_status = 'failed', summary = jsonb_set(jsonb_set("
        "summary::jsonb, '{job_status}', '\"failed\"'), '{error}', '\"interrupted (worker restarted)\"')::json "
        "WHERE job_status = 'running'"
    )
    # At most one apply/teardown runs at a time, whichever replica runs it.
    op.create_index(
        "fabric_jobs_one_running",
        "fabric_jobs",
        [sa.text("(1)")],
        unique=True,
        schema=S,
        postgresql_where=sa.text("job_status = 'running'"),
    )
    op.create_table(
        "node_baselines",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("node_ip", sa.String(64), primary_key=True),
        sa.Column("baseline_enc", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("node_baselines", schema=S)
    op.drop_index("fabric_jobs_one_running", table_name="fabric_jobs", schema=S)
    op.drop_column("fabric_jobs", "request", schema=S)
    op.drop_column("fabric_jobs", "cancel_requested", schema=S)
    op.drop_column("fabric_jobs", "heartbeat_at", schema=S)
    op.drop_column("fabric_jobs", "owner", schema=S)
