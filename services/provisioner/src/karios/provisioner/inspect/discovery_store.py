"""Discovered servers (migration 0008): one row per machine, found by its boot MAC or its serial.
SQL only; the rules are in :mod:`karios.provisioner.inspect.discovery`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from karios.common.contracts.discovery import DiscoveredServer, DiscoveryReport
from karios.common.db import Database
from karios.provisioner.inspect.discovery import discovered_server, hardware_digest, machine_serial
from karios.provisioner.models import SCHEMA

_LOCK = 0x6B_6469_7363  # pg_advisory_xact_lock key of discovery writes ("kdisc"): reports are rare
LIST_MAX = 1000


class DiscoveredRow(SQLModel, table=True):
    __tablename__ = "discovered_servers"
    __table_args__ = {"schema": SCHEMA}

    id: str = Field(primary_key=True, max_length=36)
    boot_mac: str = Field(max_length=17, unique=True)
    serial: str = Field(default="", max_length=256, index=True)
    status: str = Field(default="discovered", max_length=16)
    first_seen: datetime = Field(sa_type=sa.DateTime(timezone=True))
    last_seen: datetime = Field(sa_type=sa.DateTime(timezone=True), index=True)
    report_count: int = 1
    digest: str = Field(default="", max_length=64)
    record: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    report: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)


T = DiscoveredRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Recorded:
    server: DiscoveredServer
    created: bool
    changed: bool


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


@dataclass
class DiscoveryStore:
    db: Database

    async def record(self, new_id: str, boot_mac: str, report: DiscoveryReport, now: datetime) -> Recorded:
        """Insert the machine, or update the row with its boot MAC (else its serial): a report that
        says nothing new only counts (``changed`` false); an adopted server stays adopted."""
        serial = machine_serial(report)
        digest = hardware_digest(report)
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_LOCK)))
            match = T.c.boot_mac == boot_mac
            if serial:
                match = sa.or_(match, T.c.serial == serial)
            row = (
                (
                    await conn.execute(
                        sa.select(T)
                        .where(match)
                        .order_by(sa.desc(T.c.boot_mac == boot_mac), sa.desc(T.c.last_seen))
                        .limit(1)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                server = discovered_server(
                    new_id, boot_mac, report, first_seen=_iso(now), last_seen=_iso(now)
                )
                await conn.execute(
                    sa.insert(T).values(
                        id=new_id,
                        boot_mac=boot_mac,
                        serial=serial,
                        status=server.status,
                        first_seen=now,
                        last_seen=now,
                        report_count=1,
                        digest=digest,
                        record=server.model_dump(mode="json"),
                        report=report.model_dump(mode="json"),
                    )
                )
                return Recorded(server, created=True, changed=True)
            old = DiscoveredServer.model_validate(row["record"])
            server = discovered_server(
                row["id"],
                boot_mac,
                report,
                first_seen=old.first_seen,
                last_seen=_iso(now),
                report_count=row["report_count"] + 1,
            ).model_copy(
                update={
                    "status": old.status,
                    "hostname": old.hostname,
                    "adopted_at": old.adopted_at,
                    "adopted_by": old.adopted_by,
                }
            )
            await conn.execute(
                sa.update(T)
                .where(T.c.id == row["id"])
                .values(
                    boot_mac=boot_mac,
                    serial=serial,
                    last_seen=now,
                    report_count=server.report_count,
                    digest=digest,
                    record=server.model_dump(mode="json"),
                    report=report.model_dump(mode="json"),
                )
            )
            return Recorded(
                server, created=False, changed=digest != row["digest"] or boot_mac != row["boot_mac"]
            )

    async def list(self, status: str = "", *, offset: int = 0, limit: int = 0) -> list[DiscoveredServer]:
        """Newest report first (ties by id: pages do not overlap); ``limit`` 0 = :data:`LIST_MAX`."""
        q = (
            sa.select(T.c.record)
            .order_by(sa.desc(T.c.last_seen), T.c.id)
            .offset(offset)
            .limit(min(limit or LIST_MAX, LIST_MAX))
        )
        if status:
            q = q.where(T.c.status == status)
        async with self.db.session() as s:
            rows = (await (await s.connection()).execute(q)).scalars().all()
        return [DiscoveredServer.model_validate(r) for r in rows]

    async def get(self, id: str) -> DiscoveredServer | None:
        async with self.db.session() as s:
            rec = (await (await s.connection()).execute(sa.select(T.c.record).where(T.c.id == id))).scalar()
        return DiscoveredServer.model_validate(rec) if rec is not None else None

    async def adopt(
        self, id: str, hostname: str, by: str, now: datetime
    ) -> tuple[DiscoveredServer, bool] | None:
        """Mark it adopted (``True``); one already adopted is returned as it is (``False``)."""
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            rec = (await conn.execute(sa.select(T.c.record).where(T.c.id == id).with_for_update())).scalar()
            if rec is None:
                return None
            server = DiscoveredServer.model_validate(rec)
            if server.status == "adopted":
                return server, False
            server = server.model_copy(
                update={"status": "adopted", "hostname": hostname, "adopted_at": _iso(now), "adopted_by": by}
            )
            await conn.execute(
                sa.update(T)
                .where(T.c.id == id)
                .values(status="adopted", record=server.model_dump(mode="json"))
            )
            return server, True
