"""Inventory service: the node registry now; the NetBox adapter and host lookups build on it."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from karios.common.contracts.inventory import NodeQuery, NodeRegistered, NodeSummary, RegisterNode, RegisterNodeResult
from karios.common.errors import NotFound
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings
from karios.inventory import registry
from karios.inventory.models import SCHEMA

SERVICE = "inventory"


def create_app(settings: KariosSettings | None = None) -> FastAPI:
    settings = settings or KariosSettings()
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    subjects = rt.bus.subjects

    async def register_node(cmd: RegisterNode) -> RegisterNodeResult:
        assert rt.db is not None
        async with rt.db.session() as session, session.begin():
            result = await registry.upsert_node(session, cmd)
        await rt.bus.publish_event(
            NodeRegistered(
                bmc_ip=result.bmc_ip, created=result.created, hostname=result.hostname,
                node_ip=result.node_ip, vendor=cmd.vendor or "", is_control_node=cmd.is_control_node,
            ),
            subjects.evt("inventory", "node.registered", result.bmc_ip),
            entity=result.bmc_ip,
        )
        return result

    async def get_node(q: NodeQuery) -> NodeSummary:
        assert rt.db is not None
        async with rt.db.session() as session:
            row = await registry.get_node(session, bmc_ip=q.bmc_ip, node_ip=q.node_ip)
        if row is None:
            raise NotFound(f"no registered node with BMC IP {q.bmc_ip}" if q.bmc_ip else f"no node with IP {q.node_ip}")
        return registry.summarize(row)

    async def list_nodes(_q: NodeQuery) -> list[NodeSummary]:
        assert rt.db is not None
        async with rt.db.session() as session:
            return [registry.summarize(r) for r in await registry.list_nodes(session)]

    rt.bus.query_responder(subjects.request("inventory", "register_node"), RegisterNode, register_node)
    rt.bus.query_responder(subjects.query("inventory", "node"), NodeQuery, get_node)
    rt.bus.query_responder(subjects.query("inventory", "nodes"), NodeQuery, list_nodes)
    return build_app(rt, title="Karios inventory")
