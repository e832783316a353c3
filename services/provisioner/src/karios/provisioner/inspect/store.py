"""Hardware records (migration 0007): one row per BMC, replaced by each inspection. SQL only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Field, SQLModel

from karios.common.contracts.hardware import HardwareRecord
from karios.common.db import Database
from karios.provisioner.models import SCHEMA


class HardwareRow(SQLModel, table=True):
    __tablename__ = "hardware_records"
    __table_args__ = {"schema": SCHEMA}

    bmc_ip: str = Field(primary_key=True, max_length=64)
    inspected_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    driver: str = Field(default="", max_length=32)
    record: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)


T = HardwareRow.__table__  # type: ignore[attr-defined]


@dataclass
class HardwareStore:
    db: Database

    async def save(self, rec: HardwareRecord) -> None:
        values = {
            "bmc_ip": rec.bmc_ip,
            "inspected_at": datetime.fromisoformat(rec.inspected_at),
            "driver": rec.driver,
            "record": rec.model_dump(mode="json"),
        }
        stmt = pg_insert(T).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[T.c.bmc_ip],
            set_={k: stmt.excluded[k] for k in ("inspected_at", "driver", "record")},
            where=T.c.inspected_at <= stmt.excluded.inspected_at,  # an older read never wins
        )
        async with self.db.session() as s, s.begin():
            await (await s.connection()).execute(stmt)

    async def get(self, bmc_ip: str) -> HardwareRecord | None:
        async with self.db.session() as s:
            row = await s.get(HardwareRow, bmc_ip)
        return HardwareRecord.model_validate(row.record) if row is not None else None
