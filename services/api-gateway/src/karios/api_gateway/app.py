"""API gateway: authentication, validation, SSE, and the read model of jobs and progress."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.middleware import Middleware

from karios.api_gateway.audit import AuditTrail, AuditWriter
from karios.api_gateway.auth import Role, TokenCache, create_token
from karios.api_gateway.errordoc import document_errors
from karios.api_gateway.events import DirectSSE, EventRelay, freeze_startup_heap
from karios.api_gateway.fastpath import FastReads, fast_path_wanted, fast_reads_counter
from karios.api_gateway.linkdoc import document_links
from karios.api_gateway.models import SCHEMA
from karios.api_gateway.outbox import CommandOutbox, kill_after_commit_hook, waiting_msg_ids
from karios.api_gateway.readcache import InvalidateOnWrite, ReadCache
from karios.api_gateway.readmodel import ProvisionProjector
from karios.api_gateway.routes import ROUTERS
from karios.common.bus.stats import BusStats
from karios.common.crypto import SecretBox
from karios.common.routegate import gate_included_routers
from karios.common.service import ServiceRuntime, build_app
from karios.common.settings import KariosSettings

SERVICE = "api-gateway"


def create_app(settings: KariosSettings | None = None, *, fast_reads: bool | None = None) -> FastAPI:
    """The gateway. ``fast_reads``: answer the shared reads again before FastAPI's layers
    (:mod:`karios.api_gateway.fastpath`); default on unless spans are exported."""
    settings = settings or KariosSettings()
    rt = ServiceRuntime(SERVICE, settings, schema=SCHEMA, migrations=Path(__file__).parent / "migrations")
    assert rt.db is not None
    tokens = TokenCache(rt.db, settings.token_cache_ttl)
    tokens.listen(rt.bus)
    relay = EventRelay(
        rt.bus, rt.registry, queue_size=settings.sse_queue_size, keepalive=settings.sse_keepalive
    )
    bus_stats = BusStats(rt.bus).register(rt.registry)  # JetStream depths: read by the gateway only

    projector = ProvisionProjector(
        rt.bus,
        rt.db,
        lost_after=settings.job_lost_after,
        reconcile_every=settings.job_reconcile_interval,
        waiting=waiting_msg_ids,
    )
    outbox = CommandOutbox(rt.bus, rt.db.engine, on_relayed_many=projector.relayed_many, registry=rt.registry)
    rt.extra_checks["outbox"] = outbox.healthy
    audit = AuditWriter(rt.db)

    async def on_start(rt: ServiceRuntime) -> None:
        assert rt.db is not None
        if settings.bootstrap_admin_token is not None:
            await create_token(
                rt.db, "bootstrap-admin", Role.fabric_admin, settings.bootstrap_admin_token.get_secret_value()
            )
        await audit.start()
        await relay.start()
        bus_stats.start()
        rt.state["projector"] = projector
        await projector.start()
        await outbox.start()  # relays what an earlier process committed but never published
        freeze_startup_heap()  # full collections (100-200 ms) of it would stall SSE fan-out

    async def on_stop(_rt: ServiceRuntime) -> None:
        await outbox.stop()
        if "projector" in rt.state:
            await rt.state["projector"].stop()
        await relay.stop()
        await bus_stats.stop()
        await audit.stop()  # the records of the last requests

    app = build_app(
        rt,
        title="Karios control node API",
        description="Provision bare-metal servers over Redfish and roll out an EVPN/VXLAN fabric.",
        on_start=on_start,
        on_stop=on_stop,
    )
    app.state.relay = relay
    # Called by the HTTP server (bootapi.listeners.GranianListener) before it stops accepting
    # and drains: the SSE streams end first, so the drain and the lifespan's on_stop follow.
    app.state.before_server_stop = [relay.end_streams]
    app.add_middleware(DirectSSE)  # outside the stack: SSE bodies skip its per-chunk send wrappers
    app.state.outbox = outbox
    app.state.after_outbox_commit = kill_after_commit_hook()
    app.state.token_cache = tokens
    app.state.secret_box = SecretBox.from_settings(settings)
    app.state.read_cache = reads = ReadCache()  # queue, node, fabric reads shared for READ_TTL_S
    relay.on_event.append(reads.on_event)  # fabric/discovery answers dropped by their events
    app.add_middleware(InvalidateOnWrite)  # a write through this replica drops them at once
    # Innermost (inside the request span, after routing): one audit record per write.
    app.user_middleware.append(Middleware(AuditTrail, writer=audit))
    app.state.audit = audit
    routers = ROUTERS()
    for router in routers:
        app.include_router(router)
    document_errors(app)  # every 4xx/5xx in the OpenAPI document is ErrorResponse
    document_links(app)  # responses that name a resource link to the operations taking it
    gate_included_routers(app)  # a request skips the routers whose paths cannot be its own
    # Outermost: every shared read answered again from the read cache without FastAPI's layers.
    app.add_middleware(
        FastReads,
        tokens=tokens,
        reads=reads,
        metrics=app.state.http_metrics,
        answered=fast_reads_counter(rt.registry),
        enabled=fast_path_wanted() if fast_reads is None else fast_reads,
    )
    return app
