"""job read model: which event a job shows (its stream sequence and its sender's time)

Events reach the projector out of order (replicas pull side by side; a dead replica's events come
back after the ack wait): a job keeps the newest (``readmodel.superseded``).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
S = "gateway"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("event_seq", sa.BigInteger(), nullable=False, server_default="0"), schema=S)
    op.add_column("jobs", sa.Column("event_time", sa.DateTime(timezone=True), nullable=True), schema=S)


def downgrade() -> None:
    op.drop_column("jobs", "event_time", schema=S)
    op.drop_column("jobs", "event_seq", schema=S)
