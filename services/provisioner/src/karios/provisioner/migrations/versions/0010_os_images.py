"""the OS image catalog (issue 25 item 2): one row per image, its view as JSON

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.create_table(
        "os_images",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("os_images", schema=S)
