"""job read model: the stream sequence of the event a job shows, and of each history record

Events reach the projector out of order (replicas pull side by side; a dead replica's events come
back after the ack wait): a job keeps the newest, the history is ordered by the stream.

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
    for table in ("jobs", "provision_progresses"):
        op.add_column(
            table, sa.Column("event_seq", sa.BigInteger(), nullable=False, server_default="0"), schema=S
        )


def downgrade() -> None:
    for table in ("jobs", "provision_progresses"):
        op.drop_column(table, "event_seq", schema=S)
