"""job read model: the installer's last log lines

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "gateway"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("log_tail", sa.JSON(), nullable=True), schema=S)


def downgrade() -> None:
    op.drop_column("jobs", "log_tail", schema=S)
