"""job tokens bound to the job's life: when the installer's /complete was accepted

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
S = "provision"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("installed_at", sa.DateTime(timezone=True), nullable=True), schema=S)
    # A job that reached first_boot or completed before this column existed has completed its
    # install: its token is past /complete (its /firstboot window is counted from its last update).
    op.execute(
        "UPDATE provision.jobs SET installed_at = updated_at "
        "WHERE state IN ('first_boot', 'completed') OR (state = 'stuck' AND os_ip <> '')"
    )


def downgrade() -> None:
    op.drop_column("jobs", "installed_at", schema=S)
