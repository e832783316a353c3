"""audit trail: one row per state-changing request (``api_gateway.audit``)

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
S = "gateway"
T = "audit_log"


def upgrade() -> None:
    op.create_table(
        T,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("role", sa.String(32), nullable=True),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("route", sa.String(300), nullable=False),
        sa.Column("target", sa.String(200), nullable=True),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("client", sa.String(64), nullable=True),
        schema=S,
    )
    op.create_index(f"{T}_at_idx", T, ["at"], schema=S)
    op.create_index(f"{T}_actor_idx", T, ["actor", "id"], schema=S)
    op.create_index(f"{T}_target_idx", T, ["target", "id"], schema=S)


def downgrade() -> None:
    op.drop_table(T, schema=S)
