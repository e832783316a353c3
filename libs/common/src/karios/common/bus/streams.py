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
from nats.js.errors import NotFoundError

from karios.common.bus.subjects import Subjects

log = logging.getLogger(__name__)

CMD_DUPLICATE_WINDOW_S = 120.0
EVT_MAX_AGE_S = 7 * 24 * 3600.0
EVT_MAX_BYTES = 1 << 30
DLQ_MAX_AGE_S = 30 * 24 * 3600.0


def _file_stream(name: str, subject: str, description: str, **limits: object) -> StreamConfig:
    return StreamConfig(
        name=name, subjects=[subject], storage=StorageType.FILE, description=description, **limits
    )


def stream_configs(subjects: Subjects) -> list[StreamConfig]:
    return [
        _file_stream(
            subjects.cmd_stream,
            subjects.all_commands,
            "Karios commands: each handled by exactly one worker replica",
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=CMD_DUPLICATE_WINDOW_S,
        ),
        _file_stream(
            subjects.evt_stream,
            subjects.all_events,
            "Karios events: facts, replayable for read models and SSE resume",
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
            retention=RetentionPolicy.LIMITS,
            max_age=DLQ_MAX_AGE_S,
        ),
    ]


async def ensure_streams(js: JetStreamContext, subjects: Subjects) -> None:
    """Create the streams or bring their mutable settings in line with the declaration."""
    for cfg in stream_configs(subjects):
        try:
            await js.stream_info(cfg.name)
        except NotFoundError:
            await js.add_stream(cfg)
            log.info("stream created", extra={"stream": cfg.name})
            continue
        await js.update_stream(cfg)


async def reconcile_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Apply the declared durable consumer config; nats-py silently binds to a drifted one otherwise."""
    await js.add_consumer(stream, config)
