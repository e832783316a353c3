"""OS image records (migration 0010): one row per image, the view kept as JSON. SQL only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel

from karios.common.contracts.images import ImageView
from karios.common.db import Database
from karios.provisioner.models import SCHEMA


class OsImageRow(SQLModel, table=True):
    __tablename__ = "os_images"
    __table_args__ = {"schema": SCHEMA}

    name: str = Field(primary_key=True, max_length=64)
    state: str = Field(max_length=16)
    updated_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    record: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)


T = OsImageRow.__table__  # type: ignore[attr-defined]


@dataclass
class ImageStore:
    db: Database

    async def insert(self, view: ImageView) -> bool:
        """Store a new image; False when the name is taken."""
        try:
            async with self.db.session() as s, s.begin():
                s.add(self._row(view))
        except IntegrityError:
            return False
        return True

    async def save(self, view: ImageView) -> bool:
        """Write `view` over its row; False when the row is gone (deleted meanwhile)."""
        row = self._row(view)
        async with self.db.session() as s, s.begin():
            res = await (await s.connection()).execute(
                sa.update(T)
                .where(T.c.name == view.name)
                .values(state=row.state, updated_at=row.updated_at, record=row.record)
            )
        return bool(res.rowcount)

    async def get(self, name: str) -> ImageView | None:
        async with self.db.session() as s:
            row = await s.get(OsImageRow, name)
        return ImageView.model_validate(row.record) if row is not None else None

    async def all(self) -> list[ImageView]:
        async with self.db.session() as s:
            rows = (await (await s.connection()).execute(sa.select(T.c.record).order_by(T.c.name))).all()
        return [ImageView.model_validate(r[0]) for r in rows]

    async def delete(self, name: str) -> ImageView | None:
        async with self.db.session() as s, s.begin():
            res = (
                await (await s.connection()).execute(
                    sa.delete(T).where(T.c.name == name).returning(T.c.record)
                )
            ).first()
        return ImageView.model_validate(res[0]) if res is not None else None

    async def abandon_stale(self, older_than: timedelta, now: datetime | None = None) -> list[str]:
        """Fail the registrations nobody has touched for `older_than` (their replica died)."""
        now = now or datetime.now(UTC)
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            rows = (
                await conn.execute(
                    sa.select(T.c.name, T.c.record)
                    .where(T.c.state == "registering", T.c.updated_at < now - older_than)
                    .with_for_update()
                )
            ).all()
            for name, record in rows:
                view = ImageView.model_validate(record)
                view.state, view.updated_at = "failed", now.isoformat()
                view.message = "the provisioner registering this image stopped; register it again"
                await conn.execute(
                    sa.update(T)
                    .where(T.c.name == name)
                    .values(state="failed", updated_at=now, record=view.model_dump(mode="json"))
                )
        return [r[0] for r in rows]

    @staticmethod
    def _row(view: ImageView) -> OsImageRow:
        return OsImageRow(
            name=view.name,
            state=view.state,
            updated_at=datetime.fromisoformat(view.updated_at),
            record=view.model_dump(mode="json"),
        )
