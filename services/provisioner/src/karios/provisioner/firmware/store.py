"""Firmware update records (migration 0009): one row per update, the view kept as JSON. SQL only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from karios.common.contracts.firmware import FIRMWARE_TERMINAL, FirmwareUpdateView
from karios.common.db import Database
from karios.provisioner.models import SCHEMA


class FirmwareUpdateRow(SQLModel, table=True):
    __tablename__ = "firmware_updates"
    __table_args__ = {"schema": SCHEMA}

    id: str = Field(primary_key=True, max_length=36)
    bmc_ip: str = Field(max_length=64, index=True)
    state: str = Field(max_length=16)
    created_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    record: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)


T = FirmwareUpdateRow.__table__  # type: ignore[attr-defined]
_ACTIVE = T.c.state.notin_([*sorted(FIRMWARE_TERMINAL), "held"])  # a held update waits, it is not running


@dataclass
class FirmwareStore:
    db: Database

    async def insert(self, view: FirmwareUpdateView) -> None:
        async with self.db.session() as s, s.begin():
            s.add(self._row(view))

    async def save(self, view: FirmwareUpdateView) -> None:
        row = self._row(view)
        async with self.db.session() as s, s.begin():
            await (await s.connection()).execute(
                sa.update(T)
                .where(T.c.id == view.id)
                .values(state=row.state, updated_at=row.updated_at, record=row.record)
            )

    async def get(self, update_id: str) -> FirmwareUpdateView | None:
        async with self.db.session() as s:
            row = await s.get(FirmwareUpdateRow, update_id)
        return FirmwareUpdateView.model_validate(row.record) if row is not None else None

    async def active(self, bmc_ip: str) -> str | None:
        """The id of an update of this BMC that has not ended, if any."""
        async with self.db.session() as s:
            row = (
                await (await s.connection()).execute(sa.select(T.c.id).where(T.c.bmc_ip == bmc_ip, _ACTIVE))
            ).first()
        return row[0] if row is not None else None

    async def held(self, bmc_ip: str) -> list[FirmwareUpdateView]:
        """The BMC's updates held for its next install, oldest first."""
        async with self.db.session() as s:
            rows = (
                await (await s.connection()).execute(
                    sa.select(T.c.record)
                    .where(T.c.bmc_ip == bmc_ip, T.c.state == "held")
                    .order_by(T.c.created_at)
                )
            ).all()
        return [FirmwareUpdateView.model_validate(r[0]) for r in rows]

    async def abandon_stale(self, older_than: timedelta, now: datetime | None = None) -> list[str]:
        """Fail the updates nobody has touched for ``older_than`` (their replica died): their
        record says so and where to look (the BMC may still be applying the image)."""
        now = now or datetime.now(UTC)
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            rows = (
                await conn.execute(
                    sa.select(T.c.id, T.c.record)
                    .where(_ACTIVE, T.c.updated_at < now - older_than)
                    .with_for_update()
                )
            ).all()
            for ident, record in rows:
                view = FirmwareUpdateView.model_validate(record)
                view.state, view.updated_at, view.finished_at = "failed", now.isoformat(), now.isoformat()
                view.error = (
                    "the provisioner running this update stopped; the BMC may still be applying the image"
                    + (f" (its task: {view.task_uri})" if view.task_uri else "")
                )
                await conn.execute(
                    sa.update(T)
                    .where(T.c.id == ident)
                    .values(state="failed", updated_at=now, record=view.model_dump(mode="json"))
                )
        return [r[0] for r in rows]

    @staticmethod
    def _row(view: FirmwareUpdateView) -> FirmwareUpdateRow:
        return FirmwareUpdateRow(
            id=view.id,
            bmc_ip=view.bmc_ip,
            state=view.state,
            created_at=datetime.fromisoformat(view.created_at),
            updated_at=datetime.fromisoformat(view.updated_at),
            record=view.model_dump(mode="json"),
        )
