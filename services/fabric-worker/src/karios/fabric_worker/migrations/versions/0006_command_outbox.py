"""transactional outbox of the fabric-worker's commands (faststream-outbox tables)

Revision ID: 0006
Revises: 0005

The apply job row and its ``cmd.fabric.apply`` commit together (``karios.common.outbox``, ADR 0002);
the tables are the ones ``karios.common.outbox.outbox_tables`` declares, in schema ``fabric``.
"""

from alembic import op

from karios.common.outbox import DLQ_TABLE, TABLE, create_outbox_tables

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
S = "fabric"


def upgrade() -> None:
    create_outbox_tables(op, S)


def downgrade() -> None:
    op.drop_table(DLQ_TABLE, schema=S)
    op.drop_table(TABLE, schema=S)
