"""Database access: async engine/session, idempotent-consumer records, migrations."""

from karios.common.db.session import Database, claim_message, claim_messages, processed_messages_table

__all__ = ["Database", "claim_message", "claim_messages", "processed_messages_table"]
