"""The JetStream streams, declared in one place, and their start-up reconciliation."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import (
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from karios.common.bus.subjects import Subjects

log = logging.getLogger(__name__)
T = TypeVar("T")
_NOT_ANSWERING = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    ServiceUnavailableError,
)

CMD_DUPLICATE_WINDOW_S = 120.0
EVT_MAX_AGE_S = 7 * 24 * 3600.0
#: The event stream's size limit unless ``KARIOS_BUS_EVENTS_MAX_BYTES`` says otherwise (JetStream
#: reserves it on every server storing the stream: see :data:`STORAGE_EXCEEDED`).
EVT_MAX_BYTES = 1 << 30
DLQ_MAX_AGE_S = 30 * 24 * 3600.0


#: JetStream's error code when a stream's ``max_bytes`` does not fit the server's file store
#: (nats-server takes 75 % of its store directory's free space when none is configured).
STORAGE_EXCEEDED = 10047


class ReplicasUnavailable(RuntimeError):
    """The streams' declared replica count cannot be applied on this NATS deployment."""


class StorageUnavailable(RuntimeError):
    """A stream's size limit does not fit the JetStream store of the server; names the setting."""


def _file_stream(name: str, subject: str, description: str, replicas: int, **limits: object) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=[subject],
        storage=StorageType.FILE,
        description=description,
        num_replicas=replicas,
        **limits,
    )


def stream_configs(
    subjects: Subjects, replicas: int = 1, events_max_bytes: int = EVT_MAX_BYTES
) -> list[StreamConfig]:
    """Every stream, each stored on ``replicas`` servers (``KARIOS_BUS_REPLICAS``: 1, or 3 on a
    3-node JetStream cluster); the event stream keeps at most ``events_max_bytes``
    (``KARIOS_BUS_EVENTS_MAX_BYTES``). Durable consumers inherit their stream's replica count."""
    return [
        _file_stream(
            subjects.cmd_stream,
            subjects.all_commands,
            "Karios commands: each handled by exactly one worker replica",
            replicas,
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=CMD_DUPLICATE_WINDOW_S,
        ),
        _file_stream(
            subjects.evt_stream,
            subjects.all_events,
            "Karios events: facts, replayable for read models and SSE resume",
            replicas,
            retention=RetentionPolicy.LIMITS,
            max_age=EVT_MAX_AGE_S,
            max_bytes=events_max_bytes,
            discard=DiscardPolicy.OLD,
            duplicate_window=CMD_DUPLICATE_WINDOW_S,
        ),
        _file_stream(
            subjects.dlq_stream,
            subjects.all_dead_letters,
            "Karios dead letters: commands that exhausted retries or failed permanently",
            replicas,
            retention=RetentionPolicy.LIMITS,
            max_age=DLQ_MAX_AGE_S,
        ),
    ]


#: JetStream API calls at start-up are retried this long: on a cluster that is forming (or electing
#: a stream leader after a node died) a create/update can time out for a few seconds.
START_RETRY_S = 60.0


async def _retrying(what: str, call: Callable[[], Awaitable[T]], budget: float = START_RETRY_S) -> T:
    deadline, delay = time.monotonic() + budget, 0.5
    while True:
        try:
            return await call()
        except (
            TimeoutError,
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            ServiceUnavailableError,
        ) as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning(
                "JetStream not answering at start; retrying", extra={"what": what, "error": repr(exc)}
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def ensure_streams(
    js: JetStreamContext, subjects: Subjects, replicas: int = 1, events_max_bytes: int = EVT_MAX_BYTES
) -> None:
    """Create the streams or bring their mutable settings in line with the declaration.

    The replica count is mutable on a cluster: an existing R1 stream is scaled to R3 (and back)
    by the server, which copies the data to the new peers. A single server refuses R > 1:
    :class:`ReplicasUnavailable` names the setting instead of a bare server error; a size limit
    larger than the server's store, :class:`StorageUnavailable`."""
    for cfg in stream_configs(subjects, replicas, events_max_bytes):
        try:
            try:
                info = await _retrying(cfg.name, lambda c=cfg: js.stream_info(c.name))
            except NotFoundError:
                await _retrying(cfg.name, lambda c=cfg: js.add_stream(c))
                log.info("stream created", extra={"stream": cfg.name, "replicas": replicas})
                continue
            await _retrying(cfg.name, lambda c=cfg: js.update_stream(c))
        except APIError as exc:
            if replicas > 1 and "replica" in str(exc.description or "").lower():
                raise ReplicasUnavailable(
                    f"stream {cfg.name}: KARIOS_BUS_REPLICAS={replicas} needs a JetStream cluster of "
                    f"at least {replicas} servers ({exc.description})"
                ) from exc
            if exc.err_code == STORAGE_EXCEEDED:
                raise StorageUnavailable(
                    f"stream {cfg.name}: its size limit ({cfg.max_bytes} bytes, KARIOS_BUS_EVENTS_MAX_BYTES"
                    " for the event stream) does not fit the JetStream store of the NATS server "
                    f"({exc.description}): lower KARIOS_BUS_EVENTS_MAX_BYTES or give NATS more disk"
                ) from exc
            raise
        if info.config.num_replicas != replicas:
            log.info(
                "stream replicas changed",
                extra={"stream": cfg.name, "from": info.config.num_replicas, "to": replicas},
            )


async def reconcile_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Apply the declared durable consumer config; nats-py silently binds to a drifted one otherwise."""
    await _retrying(f"{stream}/{config.durable_name}", lambda: js.add_consumer(stream, config))
