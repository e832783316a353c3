"""What every rollout use case shares: the repository, the secret box, the settings, this
replica's running jobs, and the three outside calls (inventory lookup, event publish, lease).

The use cases themselves are functions, one per module: :mod:`.apply` (request, run, cancel),
:mod:`.teardown` (whole fabric, one node), :mod:`.checks` (preflight, post-deploy),
:mod:`.recovery` (a job whose replica died). :mod:`.handlers` wires them on the bus.

Several replicas: the job row is the source of truth (see :mod:`.repository`): the replica
running a job renews a lease on it; a job whose lease expired is taken over by a peer, which
rolls the touched nodes back (apply) or runs it again (teardown, idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter

from karios.common.bus.runtime import HandlerContext
from karios.common.contracts.fabric import FabricConfigView
from karios.common.contracts.fabric_rollout import FabricRolloutEvent, RolloutStatus
from karios.common.contracts.inventory import NodeAccess, NodeAccessQuery
from karios.common.crypto import SecretBox
from karios.common.errors import ServiceUnavailable
from karios.common.outbox import kill_after_commit_hook
from karios.common.service import ServiceRuntime
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger
from karios.fabric_worker.outbox import fabric_outbox
from karios.fabric_worker.rollout.access import node_targets, private_key
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.jobs import JobRegistry
from karios.fabric_worker.rollout.judge import VerdictMemo
from karios.fabric_worker.rollout.repository import RolloutRepository
from karios.fabric_worker.rollout.summary import JobSummary
from karios.fabric_worker.settings import FabricWorkerSettings

log = get_logger(__name__)
# One validation call for the whole node set (1,000 nodes per apply request), not one per node.
_ACCESS_LIST = TypeAdapter(list[NodeAccess])


class RolloutService:
    """One per worker process: dependencies and per-replica state of the rollout use cases.
    The running :class:`ApplyJob` lives in the :class:`JobRegistry` of the replica holding the
    job's lease."""

    def __init__(self, rt: ServiceRuntime, box: SecretBox, settings: FabricWorkerSettings) -> None:
        self.rt, self.box, self.settings = rt, box, settings
        self.registry = JobRegistry()
        self.verdicts = VerdictMemo()  # the last preflight's verdicts, parsed once (apply refusals)
        self.vnis = settings.vni_list()
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stopping = False
        self.teardown_task: asyncio.Task | None = None
        self._repo: RolloutRepository | None = None
        self._handlers: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None
        assert rt.db is not None
        # The apply job row and its command commit together; the relay publishes after commit.
        self.outbox = fabric_outbox(rt.bus, rt.db.engine, rt.registry)
        self.after_commit = kill_after_commit_hook()  # chaos tests only (None otherwise)

    @property
    def repo(self) -> RolloutRepository:
        if self._repo is None:  # the database opens with the runtime, after wiring
            assert self.rt.db is not None
            self._repo = RolloutRepository(self.rt.db, self.instance)
        return self._repo

    @property
    def cancel_subject(self) -> str:
        return self.rt.bus.subjects.broadcast("fabric", "cancel_apply")

    # -- outside calls -------------------------------------------------------------------------

    async def node_access(self, node_ip: str = "") -> list[NodeAccess]:
        """Registered nodes with an OS IP (or only ``node_ip``): one inventory round trip.
        Credentials stay encrypted in what it returns."""
        raw = await self.rt.bus.request(
            self.rt.bus.subjects.query("inventory", "node_access"), NodeAccessQuery(node_ip=node_ip or None)
        )
        return _ACCESS_LIST.validate_python(raw or [])

    async def targets_of(self, access: list[NodeAccess]) -> list[NodeTarget]:
        """SSH targets, credentials decrypted now (the caller is about to connect)."""
        keys = await self.repo.host_keys([a.node_ip for a in access])  # only the nodes asked about
        return node_targets(access, self.box, private_key(self.settings), keys)

    async def targets(self, node_ip: str = "") -> list[NodeTarget]:
        return await self.targets_of(await self.node_access(node_ip))

    async def publish(self, ev: FabricRolloutEvent, cause: Any = None) -> None:
        entity = ev.node_ip or ev.job_id
        await self.rt.bus.publish_event(
            ev, self.rt.bus.subjects.evt("fabric", ev.state, entity), cause=cause, entity=entity
        )

    async def safe_publish(self, ev: FabricRolloutEvent, cause: Any = None) -> None:
        try:
            await self.publish(ev, cause)
        except Exception:
            log.warning("fabric event not published", state=ev.state, job_id=ev.job_id)

    async def remember(self, keys: dict[str, str]) -> None:
        if n := await self.repo.remember_host_keys(keys):
            log.info("ssh host keys stored (first seen)", nodes=n)

    # -- leases --------------------------------------------------------------------------------

    async def hold_lease(
        self,
        job_id: str,
        task: asyncio.Task,
        *,
        ctx: HandlerContext | None = None,
        summary: Callable[[], JobSummary | None] = lambda: None,
        on_cancel: Callable[[], None] | None = None,
    ) -> bool:
        """Wait for `task` while renewing the lease (storing the live summary), telling the bus
        we are alive, and polling the durable cancel flag (the broadcast's backstop).
        False: the lease was lost (a peer took the job over): `task` is stopped, no rollback."""
        while not task.done():
            await asyncio.wait({task}, timeout=self.settings.beat)
            if task.done():
                break
            if ctx is not None:
                with contextlib.suppress(Exception):
                    await ctx.in_progress()
            try:
                cancel = await self.repo.heartbeat(job_id, summary())
            except Exception as exc:  # database hiccup: keep working, the lease is generous
                log.warning("fabric job heartbeat failed", job_id=job_id, error=type(exc).__name__)
                continue
            if cancel is None:
                log.error("fabric job lease lost; a peer took it over", job_id=job_id)
                await cancel_and_wait(task, grace=5.0)
                return False
            if cancel and on_cancel is not None:
                on_cancel()
        return True

    # -- lifecycle -----------------------------------------------------------------------------

    def track(self) -> None:
        """Called first by every command handler: stop() waits for it; 503 while stopping."""
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        if self.stopping:
            raise ServiceUnavailable("fabric-worker is stopping")

    async def decorate(self, view: FabricConfigView) -> FabricConfigView:
        """``last_job`` on GET fabric-config when the rollout failed or is degraded."""
        if view.rollout_status not in (RolloutStatus.FAILED, RolloutStatus.DEGRADED):
            return view
        job = await self.repo.latest_job()
        return view.model_copy(update={"last_job": job})

    async def start(self, reap: Callable[[], Awaitable[int]]) -> None:
        """Run `reap` (take over jobs whose replica is gone) now and every lease/3."""

        async def loop() -> None:
            while not self.stopping:
                try:
                    await reap()
                except Exception as exc:
                    log.warning("fabric job reaper", error=type(exc).__name__)
                await asyncio.sleep(max(0.5, self.settings.lease / 3))

        self._reaper = asyncio.get_running_loop().create_task(loop())

    async def stop(self) -> None:
        """Stop where we stand: the in-flight job keeps its row and baselines, its lease is
        released so a peer (or this worker after a restart) recovers it at once; the command
        is nak'ed for redelivery."""
        self.stopping = True
        await cancel_and_wait(self._reaper)
        await self.registry.halt()
        if self.teardown_task is not None and not self.teardown_task.done():
            self.teardown_task.cancel()
        pending = [t for t in self._handlers if t is not asyncio.current_task() and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=10)
