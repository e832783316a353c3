#!/usr/bin/env python3
"""Example subscriber of Karios events: a durable JetStream pull consumer of ``KARIOS_EVT``.

Standalone (needs only ``nats-py``): what another system would write to react to provisions,
fabric jobs and inventory changes. Prints one line per event. Delivery is at least once, so every
event is de-duplicated by its envelope ``id`` (optionally remembered in a file across restarts)
and acknowledged only after it was handled. See README.md here and docs/integrations.md.

    python subscriber.py --nats-url nats://integrator:secret@127.0.0.1:4222 \\
        --filter 'karios.evt.provision.>' --durable integrator
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

# The fields worth a glance in the one-line output, when the event carries them.
SHOWN = ("state", "status", "job_id", "node_ip", "bmc_ip", "percent", "progress", "change", "code")


class SeenIds:
    """The envelope ids already handled: the most recent ``limit`` in memory, and every one
    appended to ``path`` (if given) so a restarted subscriber skips what it already handled."""

    def __init__(self, path: Path | None, limit: int = 100_000) -> None:
        self.path, self.limit = path, limit
        self._ids: OrderedDict[str, None] = OrderedDict()
        if path is not None and path.exists():
            for line in path.read_text().splitlines()[-limit:]:
                self._ids[line.strip()] = None
        self._file = path.open("a") if path is not None else None

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids[event_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)
        if self._file is not None:
            self._file.write(event_id + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def one_line(seq: int, subject: str, env: dict[str, Any]) -> str:
    data = env.get("data") or {}
    fields = " ".join(f"{k}={data[k]}" for k in SHOWN if data.get(k) not in (None, ""))
    return (
        f"#{seq} {env.get('time', '')} {env.get('type', '?')} {subject} id={env.get('id')} {fields}".rstrip()
    )


def consumer_config(args: argparse.Namespace) -> ConsumerConfig:
    cfg = ConsumerConfig(
        name=args.durable,
        durable_name=args.durable,
        filter_subject=args.filter,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=args.ack_wait,
        max_deliver=-1,  # keep retrying; a poison message is terminated by the handler instead
        description="example subscriber (examples/subscriber)",
    )
    if args.start_seq:
        cfg.deliver_policy, cfg.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, args.start_seq
    elif args.start_time:
        cfg.deliver_policy = DeliverPolicy.BY_START_TIME
        cfg.opt_start_time = args.start_time  # a naive time is taken as UTC
    elif args.new_only:
        cfg.deliver_policy = DeliverPolicy.NEW
    else:
        cfg.deliver_policy = DeliverPolicy.ALL
    return cfg


async def run(args: argparse.Namespace) -> int:
    nc = await nats.connect(args.nats_url, inbox_prefix=args.inbox_prefix, name=args.durable)
    js = nc.jetstream()
    seen = SeenIds(args.seen_file)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    handled = duplicates = 0
    try:
        if args.replay:  # a durable keeps its position: replaying means starting it afresh
            with contextlib.suppress(NotFoundError):
                await js.delete_consumer(args.stream, args.durable)
        try:
            await js.add_consumer(args.stream, consumer_config(args))
        except BadRequestError as exc:  # it exists with another start: it resumes where it stopped
            print(
                f"durable {args.durable} kept as it is ({exc.description}); --replay restarts it",
                file=sys.stderr,
            )
        sub = await js.pull_subscribe_bind(
            args.durable, args.stream, inbox_prefix=args.inbox_prefix.encode() + b"."
        )
        print(
            f"subscribed: stream={args.stream} durable={args.durable} filter={args.filter}", file=sys.stderr
        )
        idle_since = time.monotonic()
        while not stop.is_set():
            try:
                msgs = await sub.fetch(args.batch, timeout=1.0)
            except (TimeoutError, NatsTimeout):  # nats-py raises either when none came
                if args.exit_when_idle and time.monotonic() - idle_since >= args.exit_when_idle:
                    break
                continue
            idle_since = time.monotonic()
            for msg in msgs:
                try:
                    env = json.loads(msg.data)
                    event_id = env["id"]
                except (ValueError, KeyError, TypeError):
                    print(f"not a Karios envelope on {msg.subject}: dropped", file=sys.stderr)
                    await msg.term()  # redelivering it would not help
                    continue
                if event_id in seen:
                    duplicates += 1
                    print(
                        f"duplicate id={event_id} (seq {msg.metadata.sequence.stream}) skipped",
                        file=sys.stderr,
                    )
                    await msg.ack()
                    continue
                try:
                    line = one_line(msg.metadata.sequence.stream, msg.subject, env)
                    if args.json:
                        meta = msg.metadata
                        stamp = meta.timestamp.isoformat()
                        line = json.dumps(
                            {
                                "seq": meta.sequence.stream,
                                "stream_time": stamp,
                                "nats_subject": msg.subject,
                                **env,
                            }
                        )
                    print(line, flush=True)  # the "handling": replace with your own, idempotent work
                except Exception as exc:  # any failure: let the server redeliver it later
                    print(f"handling id={event_id} failed ({exc}); redelivered later", file=sys.stderr)
                    await msg.nak(delay=5)
                    continue
                seen.add(event_id)  # before the ack: a crash in between re-delivers a known id
                await msg.ack()
                handled += 1
    finally:
        print(f"handled {handled} event(s), skipped {duplicates} duplicate(s)", file=sys.stderr)
        seen.close()
        await nc.flush()  # the last acks out, then leave (a pull subscription has nothing to drain)
        await nc.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222", help="with user:password@ if needed")
    p.add_argument("--stream", default="KARIOS_EVT", help="<BUS_PREFIX>_EVT")
    p.add_argument("--filter", default="karios.evt.>", help="subject filter, e.g. karios.evt.fabric.>")
    p.add_argument("--durable", default="integrator", help="durable consumer name (your permissions name it)")
    p.add_argument("--inbox-prefix", default="_INBOX_integrator", help="reply subjects (your permissions)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--start-seq", type=int, default=0, help="begin at this stream sequence")
    start.add_argument("--start-time", type=datetime.fromisoformat, help="begin at this time (ISO 8601, UTC)")
    start.add_argument("--new-only", action="store_true", help="only events published from now on")
    p.add_argument("--replay", action="store_true", help="delete the durable first so the start applies")
    p.add_argument("--seen-file", type=Path, help="remember handled ids here (dedupe across restarts)")
    p.add_argument("--batch", type=int, default=64, help="messages per fetch")
    p.add_argument(
        "--ack-wait", type=float, default=30.0, help="seconds before an unacked event is redelivered"
    )
    p.add_argument("--json", action="store_true", help="print each event as one JSON object")
    p.add_argument("--exit-when-idle", type=float, default=0.0, help="exit after this many quiet seconds")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
