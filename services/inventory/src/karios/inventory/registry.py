"""The node registry: upsert and lookups on ``inventory.bmc_infos``."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.contracts.inventory import (
    BmcAccess,
    NodeAccess,
    NodeSummary,
    RegisterNode,
    RegisterNodeResult,
)
from karios.inventory.models import BmcInfo

# The contract is the one list of registrable fields; the table must hold every one of them
# (tests/unit/inventory checks it). The key and the control-node flag are handled apart.
_UPDATABLE = tuple(n for n in RegisterNode.model_fields if n not in ("bmc_ip", "is_control_node"))


async def upsert_node(session: AsyncSession, cmd: RegisterNode) -> RegisterNodeResult:
    """Create or update the row for ``cmd.bmc_ip``. Fields left out (None) keep their stored value."""
    row = await session.get(BmcInfo, cmd.bmc_ip, with_for_update=True)
    created = row is None
    if row is None:
        row = BmcInfo(bmc_ip=cmd.bmc_ip, is_control_node=cmd.is_control_node)
        session.add(row)
    for name in _UPDATABLE:
        value = getattr(cmd, name)
        if value is not None:
            setattr(row, name, value)
    row.is_control_node = row.is_control_node or cmd.is_control_node
    row.updated_at = datetime.now(UTC)
    await session.flush()
    return RegisterNodeResult(
        created=created,
        hostname=row.os_hostname or row.fqdn or "",
        node_ip=row.os_ip or "",
        bmc_ip=row.bmc_ip,
    )


def summarize(row: BmcInfo) -> NodeSummary:
    return NodeSummary(
        bmc_ip=row.bmc_ip,
        hostname=row.os_hostname or "",
        fqdn=row.fqdn or "",
        node_ip=row.os_ip or "",
        os_username=row.os_username or "",
        vendor=row.vendor or "",
        primary_mac=row.primary_mac or "",
        serial_number=row.serial_number or "",
        is_control_node=row.is_control_node,
        has_bmc_credentials=bool(row.bmc_username and row.bmc_password_enc),
        has_os_credentials=bool(row.os_password_enc),
    )


async def list_nodes(session: AsyncSession) -> list[BmcInfo]:
    return list((await session.exec(select(BmcInfo).order_by(BmcInfo.bmc_ip))).all())


async def get_node(
    session: AsyncSession, *, bmc_ip: str | None = None, node_ip: str | None = None
) -> BmcInfo | None:
    if bmc_ip:
        return await session.get(BmcInfo, bmc_ip)
    if node_ip:
        return (await session.exec(select(BmcInfo).where(BmcInfo.os_ip == node_ip))).first()
    return None


def node_access(row: BmcInfo) -> NodeAccess | None:
    """SSH details of a node (password as stored ciphertext); ``None`` without an OS IP."""
    if not row.os_ip:
        return None
    # Built directly (not through summarize() and a dump): the fabric asks for 1,000 of these
    # per apply request (benchmarks/every_route.py, issue 28).
    return NodeAccess(
        bmc_ip=row.bmc_ip,
        hostname=row.os_hostname or "",
        fqdn=row.fqdn or "",
        node_ip=row.os_ip,
        vendor=row.vendor or "",
        os_username=row.os_username or "root",
        os_password_enc=row.os_password_enc,
        ssh_host_key=row.ssh_host_key,
        is_control_node=row.is_control_node,
    )


def bmc_access(row: BmcInfo) -> BmcAccess:
    """How to reach the BMC (password as stored ciphertext, decrypted only by the provisioner)."""
    return BmcAccess(
        bmc_ip=row.bmc_ip,
        vendor=row.vendor or "",
        username=row.bmc_username,
        password_enc=row.bmc_password_enc,
        serial_number=row.serial_number or "",
        hostname=row.os_hostname or row.fqdn or "",
    )
