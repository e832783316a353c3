"""install method of a job and the installer's last log lines

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("method", sa.String(32), nullable=False, server_default=""), schema=S)
    op.add_column("jobs", sa.Column("log_tail", sa.JSON(), nullable=True), schema=S)


def downgrade() -> None:
    for col in ("log_tail", "method"):
        op.drop_column("jobs", col, schema=S)
