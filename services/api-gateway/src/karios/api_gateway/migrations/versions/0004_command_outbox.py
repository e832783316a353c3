"""transactional outbox of the gateway's commands (faststream-outbox tables)

Revision ID: 0004
Revises: 0003

The columns, partial indexes and CHECK are those ``faststream_outbox.make_outbox_table`` /
``make_dlq_table`` (0.19) declare; ``outbox.py`` builds the same tables in schema ``gateway``.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "gateway"
T, D = "command_outbox", "command_outbox_dlq"
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        T,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("headers", JSONB(), nullable=True),
        sa.Column("attempts_count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("deliveries_count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("next_attempt_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("first_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acquired_token", sa.Uuid(), nullable=True),
        sa.Column("timer_id", sa.String(255), nullable=True),
        sa.CheckConstraint("(acquired_token IS NULL) = (acquired_at IS NULL)", name=f"{T}_lease_ck"),
        schema=S,
    )
    cols = ["queue", "next_attempt_at", "id"]
    for name, where in (("pending", "acquired_token IS NULL"), ("leased", "acquired_token IS NOT NULL")):
        op.create_index(f"{T}_{name}_idx", T, cols, schema=S, postgresql_where=sa.text(where))
    op.create_index(
        f"{T}_timer_id_uq",
        T,
        ["queue", "timer_id"],
        unique=True,
        schema=S,
        postgresql_where=sa.text("timer_id IS NOT NULL"),
    )
    op.create_table(
        D,
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("original_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("headers", JSONB(), nullable=True),
        sa.Column("deliveries_count", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("failure_reason", sa.String(64), nullable=False),
        sa.Column("last_exception", sa.String(), nullable=True),
        sa.Column("timer_id", sa.String(255), nullable=True),
        schema=S,
    )
    op.create_index(f"{D}_queue_failed_idx", D, ["queue", "failed_at"], schema=S)


def downgrade() -> None:
    op.drop_table(D, schema=S)
    op.drop_table(T, schema=S)
