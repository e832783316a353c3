"""What each use case needs from the job service, and nothing more.

The use cases (:mod:`.admitter`, :mod:`.callbacks`, :mod:`.upkeep`, :mod:`.worker`) take the
service as one of these protocols; :class:`~karios.provisioner.jobs.service.JobService`
satisfies them all. The service module imports the use cases; no use case imports it back.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from karios.common.bus.runtime import Bus
from karios.common.contracts.provision import StartProvision
from karios.common.crypto import SecretBox
from karios.provisioner.config import ProvisionerConfig
from karios.provisioner.drivers import RedfishDriver
from karios.provisioner.install import InstallMethod
from karios.provisioner.jobs.repository import JobRepository
from karios.provisioner.media import MediaBuilder
from karios.provisioner.models import Job
from karios.provisioner.statemachine import State


class JobStore(Protocol):
    """The settings and the job table: what admission reads."""

    cfg: ProvisionerConfig
    repo: JobRepository


class JobSteps(JobStore, Protocol):
    """Read a job and move it (one transition + its event + the end of the job)."""

    async def load(self, job_id: str) -> Job: ...

    async def move(self, job_id: str, target: State, message: str = "", **options: Any) -> Job:
        """``options``: ``percent``, ``fact``, ``owned``, ``guard`` and column values, as
        :meth:`~karios.provisioner.jobs.service.JobService.move` takes them."""
        ...


class CallbackPort(JobSteps, Protocol):
    """Installer reports (:mod:`.callbacks`): token check, stages of the method, the inventory."""

    bus: Bus
    box: SecretBox
    methods: dict[str, InstallMethod]


class LeasedJobs(JobSteps, Protocol):
    """What both the worker phase and lease upkeep do with this replica's jobs."""

    replica: str
    tasks: dict[str, asyncio.Task[None]]

    async def fail(self, job_id: str, message: str) -> None: ...


class UpkeepPort(LeasedJobs, Protocol):
    """Stuck sweep and lease upkeep (:mod:`.upkeep`): claim, resume, hand over."""

    async def emit(
        self, job: Job, message: str = "", percent: int | None = None, fact: str | None = None
    ) -> None: ...

    def spawn(self, job_id: str) -> None: ...

    async def claim_expired(self, limit: int | None = None) -> list[tuple[str, int]]: ...


class AdmissionGate(Protocol):
    """The admission loop as a worker sees it: wait for a slot."""

    async def wait(self, job_id: str) -> None: ...


class FirmwareBeforeInstall(Protocol):
    """Firmware updates held for a BMC's next install (``firmware/service.py``)."""

    async def before_install(self, bmc_ip: str, job_id: str) -> int: ...


class WorkerPort(LeasedJobs, Protocol):
    """The worker phase (:mod:`.worker`): admission, BMC, medium, mount, gate, reset."""

    media: MediaBuilder
    firmware: FirmwareBeforeInstall | None
    mounts: int
    resetting: dict[str, asyncio.Task[str]]
    build_sem: asyncio.Semaphore
    bmc_sem: asyncio.Semaphore
    subnet_sems: dict[str, asyncio.Semaphore]

    @property
    def admitter(self) -> AdmissionGate: ...

    def verify(self, job: Job) -> Job: ...

    async def check(self, job_id: str) -> Job: ...

    async def is_cancelled(self, job_id: str) -> bool: ...

    def media_url(self, job_id: str) -> str: ...

    async def job_token(self, job: Job) -> str: ...

    async def driver(self, cmd: StartProvision, *, probe: bool = False) -> RedfishDriver: ...

    async def build_medium(self, cmd: StartProvision, token: str, job: Job | None = None) -> None: ...

    async def cleanup_bmc(self, job: Job) -> None: ...

    async def emit(
        self, job: Job, message: str = "", percent: int | None = None, fact: str | None = None
    ) -> None:
        """An event of the job's current state with ``message`` (no transition): the BIOS read-back."""
        ...
