"""The fabric's node set: SQL on ``inventory.compute_nodes`` merged with the registry rows
(``bmc_infos``) that carry an OS IP. One node per OS address; a compute-node row wins over a
registry row of the same address (it has its own credentials and pinned key) and takes the
BMC link from it."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import delete, select
from sqlmodel.ext.asyncio.session import AsyncSession

from karios.common.contracts.inventory import NodeAccess
from karios.common.contracts.nodes import ComputeNode, NodeCredentials
from karios.common.netaddr import ip_sort_key
from karios.inventory import registry
from karios.inventory.models import SCHEMA, BmcInfo, ComputeNodeRow


def auth_of(password_enc: str | None, key_enc: str | None) -> str:
    if password_enc and key_enc:
        return "password+ssh_key"
    return "password" if password_enc else "ssh_key" if key_enc else "worker_key"


def view(row: ComputeNodeRow, bmc_ip: str = "") -> ComputeNode:
    return ComputeNode(
        node_ip=row.node_ip,
        hostname=row.hostname or "",
        bmc_ip=row.bmc_ip or bmc_ip,
        ssh_port=row.ssh_port,
        os_username=row.os_username,
        auth=auth_of(row.os_password_enc, row.ssh_private_key_enc),  # type: ignore[arg-type]
        source=row.source,  # type: ignore[arg-type]
        host_key_fingerprint=row.host_key_fingerprint or "",
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def registry_view(row: BmcInfo) -> ComputeNode:
    return ComputeNode(
        node_ip=row.os_ip or "",
        hostname=row.os_hostname or row.fqdn or "",
        bmc_ip=row.bmc_ip,
        os_username=row.os_username or "root",
        auth="password" if row.os_password_enc else "worker_key",
        source="registry",
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def access(row: ComputeNodeRow, linked: BmcInfo | None) -> NodeAccess:
    """SSH access of a compute node (secrets as stored ciphertext)."""
    return NodeAccess(
        bmc_ip=row.bmc_ip or (linked.bmc_ip if linked else ""),
        hostname=row.hostname or "",
        fqdn=row.hostname or (linked.fqdn or "" if linked else ""),
        node_ip=row.node_ip,
        os_username=row.os_username,
        os_password_enc=row.os_password_enc,
        ssh_host_key=row.host_key,
        vendor=(linked.vendor or "") if linked else "",
        is_control_node=bool(linked and linked.is_control_node),
        source=row.source,
        ssh_port=row.ssh_port,
        ssh_private_key_enc=row.ssh_private_key_enc,
    )


async def node_set(session: AsyncSession) -> list[tuple[ComputeNodeRow | None, BmcInfo | None]]:
    """Every node with an OS address, in address order: (compute row, registry row)."""
    by_ip: dict[str, tuple[ComputeNodeRow | None, BmcInfo | None]] = {}
    for b in await registry.list_nodes(session):
        if b.os_ip:
            by_ip[b.os_ip] = (None, b)
    for c in (await session.exec(select(ComputeNodeRow))).all():
        linked = by_ip.get(c.node_ip, (None, None))[1]
        by_ip[c.node_ip] = (c, linked)
    return [by_ip[ip] for ip in sorted(by_ip, key=ip_sort_key)]


Pair = tuple[ComputeNodeRow | None, BmcInfo | None]

# The node set's addresses in node_set's order (IPv4 before IPv6, numerically; anything else
# last), counted and sliced in PostgreSQL: a page or one node costs that, not the whole set.
_ADDRESSES = (
    "(SELECT node_ip AS ip FROM inventory.compute_nodes UNION "
    "SELECT os_ip FROM inventory.bmc_infos WHERE os_ip IS NOT NULL AND os_ip <> '') s"
)
_PAGE = sa.text(
    "SELECT ip, count(*) OVER () AS total FROM " + _ADDRESSES + " "  # noqa: S608 (constants only)
    "ORDER BY CASE WHEN ip ~ '^[0-9A-Fa-f:.]+$' THEN ip::inet END NULLS LAST, ip OFFSET :o LIMIT :l"
)
_COUNT = sa.text("SELECT count(*) FROM " + _ADDRESSES)  # noqa: S608 (constants only)
#: What changes whenever a row of either table is inserted, updated or deleted: its row count and
#: the sum of its rows' transaction ids (``xmin``: a new one on every insert and update).
NODE_SET_FINGERPRINT = sa.text(
    "SELECT (SELECT count(*) FROM inventory.compute_nodes), "
    "(SELECT coalesce(sum(xmin::text::bigint), 0) FROM inventory.compute_nodes), "
    "(SELECT count(*) FROM inventory.bmc_infos), "
    "(SELECT coalesce(sum(xmin::text::bigint), 0) FROM inventory.bmc_infos)"
)
assert SCHEMA == "inventory"  # the schema of the statements above


async def _pairs(session: AsyncSession, ips: list[str]) -> list[Pair]:
    """(compute row, registry row) of each address, as node_set pairs them."""
    rows = await session.exec(select(ComputeNodeRow).where(ComputeNodeRow.node_ip.in_(ips)))  # type: ignore[attr-defined]
    compute_rows = {c.node_ip: c for c in rows.all()}
    linked: dict[str, BmcInfo] = {}
    query = select(BmcInfo).where(BmcInfo.os_ip.in_(ips)).order_by(BmcInfo.bmc_ip)  # type: ignore[union-attr]
    for b in (await session.exec(query)).all():
        linked[str(b.os_ip)] = b  # the last by BMC address wins, as in node_set
    return [(compute_rows.get(ip), linked.get(ip)) for ip in ips]


async def node_page(session: AsyncSession, offset: int, limit: int) -> tuple[list[Pair], int]:
    """One page of node_set (same order, same pairs) and the size of the whole set."""
    result = (await session.exec(_PAGE, params={"o": offset, "l": limit})).all()  # type: ignore[call-overload]
    if not result and offset:  # past the end: the total still counts
        total = (await session.exec(_COUNT)).scalar_one()  # type: ignore[call-overload]
        return [], int(total)
    return await _pairs(session, [r.ip for r in result]), int(result[0].total) if result else 0


async def node_set_fingerprint(session: AsyncSession) -> tuple[int, ...]:
    """:data:`NODE_SET_FINGERPRINT` now."""
    row = (await session.exec(NODE_SET_FINGERPRINT)).one()  # type: ignore[call-overload]
    return tuple(int(v) for v in row)


async def node_of(session: AsyncSession, node_ip: str) -> Pair | None:
    """The node_set pair of one address, or None."""
    pair = (await _pairs(session, [node_ip]))[0]
    return None if pair == (None, None) else pair


def to_view(pair: tuple[ComputeNodeRow | None, BmcInfo | None]) -> ComputeNode:
    c, b = pair
    if c is not None:
        return view(c, b.bmc_ip if b else "")
    assert b is not None
    return registry_view(b)


def to_access(pair: tuple[ComputeNodeRow | None, BmcInfo | None]) -> NodeAccess | None:
    c, b = pair
    if c is not None:
        return access(c, b)
    assert b is not None
    return registry.node_access(b)


async def get(session: AsyncSession, node_ip: str) -> ComputeNodeRow | None:
    return await session.get(ComputeNodeRow, node_ip)


async def upsert(
    session: AsyncSession,
    creds: NodeCredentials,
    *,
    source: str,
    hostname: str | None,
    bmc_ip: str | None,
    host_key: str | None = None,
    fingerprint: str | None = None,
) -> tuple[ComputeNodeRow, bool]:
    """Create or update the row of ``creds.node_ip``; a row of the same BMC under another
    address (the node was re-provisioned with a new one) is replaced. (row, created)."""
    if bmc_ip:
        other = (ComputeNodeRow.bmc_ip == bmc_ip, ComputeNodeRow.node_ip != creds.node_ip)
        await session.exec(delete(ComputeNodeRow).where(*other))  # type: ignore[call-overload]
    row = await session.get(ComputeNodeRow, creds.node_ip, with_for_update=True)
    created = row is None
    if row is None:
        row = ComputeNodeRow(node_ip=creds.node_ip)
        session.add(row)
    row.ssh_port, row.os_username = creds.ssh_port, creds.os_username
    row.os_password_enc, row.ssh_private_key_enc = creds.os_password_enc, creds.ssh_private_key_enc
    row.source = source
    row.hostname = hostname or row.hostname
    row.bmc_ip = bmc_ip or row.bmc_ip
    if host_key or source == "firstboot":  # a fresh install has a new host key: first contact again
        row.host_key, row.host_key_fingerprint = host_key, fingerprint
    row.updated_at = datetime.now(UTC)
    await session.flush()
    return row, created


async def remove(session: AsyncSession, node_ip: str) -> None:
    """Drop the compute row and the OS address of a registry row holding it (its BMC record
    stays: provisioning still needs it)."""
    await session.exec(delete(ComputeNodeRow).where(ComputeNodeRow.node_ip == node_ip))  # type: ignore[arg-type]
    for b in (await session.exec(select(BmcInfo).where(BmcInfo.os_ip == node_ip))).all():
        b.os_ip = None
        b.updated_at = datetime.now(UTC)
        session.add(b)
