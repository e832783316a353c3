"""The JetStream streams, declared in one place, and their start-up reconciliation."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import (
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from karios.common.bus.subjects import Subjects

log = logging.getLogger(__name__)

CMD_DUPLICATE_WINDOW_S = 120.0
EVT_MAX_AGE_S = 7 * 24 * 3600.0
EVT_MAX_BYTES = 1 << 30
DLQ_MAX_AGE_S = 30 * 24 * 3600.0


class ReplicasUnavailable(RuntimeError):
    """The streams' declared replica count cannot be applied on this NATS deployment."""


def _file_stream(name: str, subject: str, description: str, replicas: int, **limits: object) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=[subject],
        storage=StorageType.FILE,
        description=description,
        num_replicas=replicas,
        **limits,
    )


def stream_configs(subjects: Subjects, replicas: int = 1) -> list[StreamConfig]:
    """Every stream, each stored on ``replicas`` servers (``KARIOS_BUS_REPLICAS``: 1, or 3 on a
    3-node JetStream cluster). Durable consumers inherit their stream's replica count."""
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
            max_bytes=EVT_MAX_BYTES,
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


async def ensure_streams(js: JetStreamContext, subjects: Subjects, replicas: int = 1) -> None:
    """Create the streams or bring their mutable settings in line with the declaration.

    The replica count is mutable on a cluster: an existing R1 stream is scaled to R3 (and back)
    by the server, which copies the data to the new peers. A single server refuses R > 1:
    :class:`ReplicasUnavailable` names the setting instead of a bare server error."""
    for cfg in stream_configs(subjects, replicas):
        try:
            try:
                info = await js.stream_info(cfg.name)
            except NotFoundError:
                await js.add_stream(cfg)
                log.info("stream created", extra={"stream": cfg.name, "replicas": replicas})
                continue
            await js.update_stream(cfg)
        except BadRequestError as exc:
            if replicas > 1 and "replica" in str(exc.description or "").lower():
                raise ReplicasUnavailable(
                    f"stream {cfg.name}: KARIOS_BUS_REPLICAS={replicas} needs a JetStream cluster of "
                    f"at least {replicas} servers ({exc.description})"
                ) from exc
            raise
        if info.config.num_replicas != replicas:
            log.info(
                "stream replicas changed",
                extra={"stream": cfg.name, "from": info.config.num_replicas, "to": replicas},
            )


async def reconcile_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Apply the declared durable consumer config; nats-py silently binds to a drifted one otherwise."""
    await js.add_consumer(stream, config)
