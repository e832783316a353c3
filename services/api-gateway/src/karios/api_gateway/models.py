"""Tables owned by the gateway (schema ``gateway``): API tokens and the read models."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from karios.common.db import processed_messages_table

SCHEMA = "gateway"


def _now() -> datetime:
    return datetime.now(UTC)


class ApiToken(SQLModel, table=True):
    """An operator token. Only its SHA-256 is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"
    __table_args__ = {"schema": SCHEMA}

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=200, unique=True)
    role: str = Field(max_length=32)
    token_hash: str = Field(max_length=64, unique=True, index=True)
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    revoked: bool = False


processed_messages = processed_messages_table(SQLModel.metadata, SCHEMA)
