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


def stream_configs(subjects: Subjects) -> list[StreamConfig]:
    return [
        StreamConfig(
            name=subjects.cmd_stream,
            subjects=[subjects.all_commands],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=CMD_DUPLICATE_WINDOW_S,
            description="Karios commands: each handled by exactly one worker replica",
        ),
        StreamConfig(
            name=subjects.evt_stream,
            subjects=[subjects.all_events],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=EVT_MAX_AGE_S,
            max_bytes=EVT_MAX_BYTES,
            discard=DiscardPolicy.OLD,
            duplicate_window=CMD_DUPLICATE_WINDOW_S,
            description="Karios events: facts, replayable for read models and SSE resume",
        ),
        StreamConfig(
            name=subjects.dlq_stream,
            subjects=[subjects.all_dead_letters],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=DLQ_MAX_AGE_S,
            description="Karios dead letters: commands that exhausted retries or failed permanently",
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
