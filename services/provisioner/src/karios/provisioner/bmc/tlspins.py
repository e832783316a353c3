"""BMC TLS pins (trust on first use): one SHA-256 fingerprint per BMC, SQL only.

Kept by the provisioner, the only service that speaks TLS to BMCs (see docs/provisioning.md
"BMC TLS" for why not the inventory registry). First writer wins: two replicas contacting a
new BMC at once agree on one pin (``INSERT … ON CONFLICT DO NOTHING`` then read back).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Field, SQLModel

from karios.common.bus.runtime import Bus
from karios.common.contracts.bmc_tls import ClearTlsPin, TlsPin, TlsPinCleared, TlsPinList, TlsPinsQuery
from karios.common.db import Database
from karios.common.errors import NotFound
from karios.provisioner.models import SCHEMA


def _now() -> datetime:
    return datetime.now(UTC)


class BmcTlsPin(SQLModel, table=True):
    """The certificate a BMC presented on first contact (migration 0004)."""

    __tablename__ = "bmc_tls_pins"
    __table_args__ = {"schema": SCHEMA}

    bmc_ip: str = Field(primary_key=True, max_length=64)
    fingerprint: str = Field(max_length=95)  # SHA-256, "AB:CD:…"
    pinned_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


T = BmcTlsPin.__table__  # type: ignore[attr-defined]


def _view(row: BmcTlsPin) -> TlsPin:
    return TlsPin(bmc_ip=row.bmc_ip, fingerprint=row.fingerprint, pinned_at=row.pinned_at.isoformat())


@dataclass
class TlsPins:
    """The :class:`~karios.provisioner.drivers.tls.PinStore` of the service, plus list and clear."""

    db: Database

    async def get(self, bmc_ip: str) -> str | None:
        async with self.db.session() as s:
            row = await s.get(BmcTlsPin, bmc_ip)
        return row.fingerprint if row else None

    async def record(self, bmc_ip: str, fingerprint: str) -> str:
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            await conn.execute(
                pg_insert(T)
                .values(bmc_ip=bmc_ip, fingerprint=fingerprint, pinned_at=_now())
                .on_conflict_do_nothing()
            )
            pinned = (await conn.execute(sa.select(T.c.fingerprint).where(T.c.bmc_ip == bmc_ip))).scalar_one()
        return str(pinned)

    async def list(self, bmc_ip: str | None = None) -> TlsPinList:
        query = sa.select(BmcTlsPin).order_by(BmcTlsPin.bmc_ip)  # type: ignore[arg-type]
        if bmc_ip:
            query = query.where(BmcTlsPin.bmc_ip == bmc_ip)  # type: ignore[arg-type]
        async with self.db.session() as s:
            rows = (await s.exec(query)).scalars().all()  # type: ignore[call-overload]
        return TlsPinList(pins=[_view(r) for r in rows])

    async def clear(self, bmc_ip: str) -> TlsPinCleared:
        """Forget a BMC's pin: its next contact pins what it presents then (404 if none)."""
        async with self.db.session() as s, s.begin():
            conn = await s.connection()
            gone = (
                await conn.execute(sa.delete(T).where(T.c.bmc_ip == bmc_ip).returning(T.c.fingerprint))
            ).first()
        if gone is None:
            raise NotFound(f"bmc_ip: no TLS pin for BMC {bmc_ip}", field="bmc_ip")
        return TlsPinCleared(bmc_ip=bmc_ip, fingerprint=gone[0])


def wire_tls_pins(bus: Bus, pins: TlsPins) -> None:
    """The operator's view of the pins: list them, clear one (the gateway's /controlnode/bmc-tls)."""

    async def on_list(q: TlsPinsQuery) -> TlsPinList:
        return await pins.list(q.bmc_ip)

    async def on_clear(q: ClearTlsPin) -> TlsPinCleared:
        return await pins.clear(q.bmc_ip)

    bus.query_responder(bus.subjects.query("provision", "tls_pins"), TlsPinsQuery, on_list)
    bus.query_responder(bus.subjects.request("provision", "clear_tls_pin"), ClearTlsPin, on_clear)
