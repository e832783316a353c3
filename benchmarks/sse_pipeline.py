"""Event pipeline benchmark: worker publishes → JetStream → gateway relay → N SSE clients.

Prints a table: for N = 1, 100, 1000 SSE clients, deliveries/s and p50/p95/p99 latency from
publish to receipt by the client and the ratio of p99 to the limit (issue 14: p99 < 100 ms at
1,000 clients and 10 events/s), beside raw nats-py publish→subscribe on the same server, and
the CPU each part used while the events were published (gateway, load generator, publisher;
100% = one core).

    uv run python benchmarks/sse_pipeline.py [--events 100] [--rate 10] [--clients 1,100,1000]
        [--gateways 1,2] [--client-procs 0]

The gateway runs as its own process (`karios run api-gateway`), as in production; with
``--gateways 2`` two gateway processes share the clients (each relays every event, as replicas
behind a load balancer do). The SSE clients run in their own processes (``--client-procs``;
0 = one per 500 clients), reading raw sockets, so the load generator neither shares the
gateway's event loop nor costs a JSON parse per delivery. Uses the NATS/PostgreSQL of
KARIOS_NATS_URL / KARIOS_DATABASE_URL (default 127.0.0.1).

Publishing starts once every client is registered with its gateway (its ``: connected`` frame
arrived, whose ``id`` is the stream sequence it receives every event after). Every client must
receive every event once and in order: a row with any shortfall (an event missing, duplicated or
out of order, a client cut or refused) is marked FAILED in the table, the events missing are
named (which event, how many clients, on which gateway; published after the client joined, i.e.
lost, or before it) with the relay's warnings from that gateway's log, and the script exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import nats
import psutil

from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Event
from karios.common.settings import KariosSettings


class BenchTick(Event):
    TYPE = "karios.bench.tick.v1"
    seq: int
    sent_ns: int
    job_id: str = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- load generator (own process)

_SENT = re.compile(rb'"seq":(\d+),"sent_ns":(\d+)')
#: The gateway's first frame: the client is registered and receives every event after this id.
_JOINED = re.compile(rb": connected\nid: (\d+)\n")


class _Client(asyncio.Protocol):
    """One SSE connection: records publish→receipt for each frame as its bytes arrive."""

    def __init__(self, request: bytes, worker: _Worker) -> None:
        self.request, self.w = request, worker
        self.tail = b""
        self.got = 0
        self.seen: set[int] = set()  # the events' own counters (BenchTick.seq)
        self.last = -1
        self.dups = self.disorder = 0
        self.connected = False
        self.joined: int | None = None  # the stream sequence the gateway registered it after
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        buf = self.tail + data if self.tail else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self.tail = buf
            return
        whole, self.tail = buf[: end + 2], buf[end + 2 :]
        if not self.connected:
            if not whole.startswith(b"HTTP/1.1 200"):
                self.w.failed += 1
                self.w.finished(self)
                return
            if b": connected" in whole:
                self.connected = True
                joined = _JOINED.search(whole)
                self.joined = int(joined.group(1)) if joined else None
                self.w.ready(self)
        lat, worst = self.w.latencies, self.w.worst
        for m in _SENT.finditer(whole):
            ms = (now - int(m.group(2))) / 1e6
            lat.append(ms)
            seq = int(m.group(1))
            if ms > worst.get(seq, 0.0):
                worst[seq] = ms
            if seq in self.seen:
                self.dups += 1
            else:
                self.seen.add(seq)
                self.got += 1
            if seq < self.last:
                self.disorder += 1
            self.last = max(self.last, seq)
        if b"event: reconnect" in whole:
            self.w.cut += 1
            self.w.finished(self)
        elif self.got >= self.w.expected:
            # Stay connected until every client is done: 1,000 disconnects while the gateway
            # still delivers the last event would be measured as that event's latency.
            self.w.finished(self, close=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.w.finished(self)


class _Worker:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.latencies: list[float] = []
        self.worst: dict[int, float] = {}  # per event: its slowest delivery
        self.failed = self.cut = 0
        self.waiting_ready: set[_Client] = set()
        self.open: set[_Client] = set()
        self.all_ready = asyncio.Event()
        self.all_done = asyncio.Event()

    def ready(self, c: _Client) -> None:
        self.waiting_ready.discard(c)
        if not self.waiting_ready:
            self.all_ready.set()

    def finished(self, c: _Client, *, close: bool = True) -> None:
        if c in self.open:
            self.open.discard(c)
            if close and c.transport is not None:
                c.transport.close()
        self.ready(c)
        if not self.open:
            self.all_done.set()


async def worker_main(ports: list[int], n: int, expected: int, token: str, timeout: float) -> None:
    """Open ``n`` SSE clients (round-robin over ``ports``), print READY once every one of them is
    registered with its gateway (its ``: connected`` frame arrived), then a JSON result."""
    loop = asyncio.get_running_loop()
    w = _Worker(expected)
    req = (
        "GET /controlnode/events?channel=provision HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    # Every client is waited for before the first connects: were they added one by one, the
    # barrier would open as soon as the clients connected *so far* were all registered (in a
    # pause between batches, on a loaded machine), and the publisher would start while the rest
    # were still being accepted — they would miss the first events, published before they joined.
    clients = [_Client(req, w) for _ in range(n)]
    w.waiting_ready.update(clients)
    w.open.update(clients)
    for i, c in enumerate(clients):
        await loop.create_connection(lambda c=c: c, "127.0.0.1", ports[i % len(ports)])
        if i % 50 == 49:
            await asyncio.sleep(0.02)
    await asyncio.wait_for(w.all_ready.wait(), 120)
    assert not w.waiting_ready, "READY before every client was registered"
    # No collector pauses in the measurement: they would be the load generator's, not the gateway's.
    gc.freeze()
    gc.disable()
    print("READY", flush=True)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(w.all_done.wait(), timeout)
    cpu = (cpu_seconds() - cpu0) / max(1e-9, time.perf_counter() - t0)
    for c in clients:
        w.finished(c)
        if c.transport is not None:
            c.transport.close()
    got = sum(c.got for c in clients)
    short = [(i % len(ports), c.got, c.connected) for i, c in enumerate(clients) if c.got < expected]
    # Per client that missed events: its gateway, the id it joined after, the events (BenchTick.seq).
    missed = [
        (i % len(ports), c.joined, sorted(set(range(expected)) - c.seen))
        for i, c in enumerate(clients)
        if c.connected and c.got < expected
    ]
    sys.stdout.write(
        json.dumps(
            {
                "latencies": w.latencies,
                "worst": w.worst,
                "got": got,
                "failed": w.failed,
                "cut": w.cut,
                "cpu": cpu,
                "short": short[:20],
                "n_short": len(short),
                "missed": missed,
                "dups": sum(c.dups for c in clients),
                "disorder": sum(c.disorder for c in clients),
            }
        )
        + "\n"
    )
    sys.stdout.flush()


# ---------------------------------------------------------------- the measured run


async def run_sse(
    n_clients: int,
    events: int,
    rate: float,
    ports: list[int],
    gateways: list[psutil.Process],
    settings: KariosSettings,
    token: str,
    procs: int,
) -> dict:
    procs = procs or max(1, math.ceil(n_clients / 500))
    procs = min(procs, n_clients)
    timeout = events / rate + 30
    workers = []
    for k in range(procs):
        share = n_clients // procs + (1 if k < n_clients % procs else 0)
        workers.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--worker",
                ",".join(map(str, ports)),
                str(share),
                str(events),
                token,
                str(timeout),
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 27,  # the result line carries every latency
            )
        )
    for wp in workers:
        line = await asyncio.wait_for(wp.stdout.readline(), 180)  # type: ignore[union-attr]
        if line.strip() != b"READY":
            raise RuntimeError(f"load generator did not start: {line!r}")
    bus = Bus.from_settings(settings, "bench-worker")
    await bus.start()
    gw_cpu0 = [sum(p.cpu_times()[:2]) for p in gateways]
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    stored: list[int] = []  # each event's stream sequence (its SSE id)
    for i in range(events):
        ack = await bus.publish_event(
            BenchTick(seq=i, sent_ns=time.time_ns()), bus.subjects.evt("provision", "bench", "bench")
        )
        stored.append(ack.seq)
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    pub_elapsed = time.perf_counter() - t0
    gw_cpu = [(sum(p.cpu_times()[:2]) - c) / pub_elapsed for p, c in zip(gateways, gw_cpu0, strict=True)]
    pub_cpu = (cpu_seconds() - cpu0) / pub_elapsed
    results = []
    for wp in workers:
        out = await wp.stdout.readline()  # type: ignore[union-attr]
        await wp.wait()
        results.append(json.loads(out))
    elapsed = time.perf_counter() - t0
    await bus.stop()
    latencies = [x for r in results for x in r["latencies"]]
    # Each event a client missed: after the id it joined at (lost by the gateway), or published
    # before the gateway registered it (the load generator started the run too early).
    missing: dict[tuple[int, int], int] = {}  # (gateway, event) -> clients
    lost = early = 0
    for r in results:
        for gw, joined, seqs in r["missed"]:
            for seq in seqs:
                missing[gw, seq] = missing.get((gw, seq), 0) + 1
                if joined is not None and stored[seq] <= joined:
                    early += 1
                else:
                    lost += 1
    worst: dict[int, float] = {}
    for r in results:
        for seq, ms in r["worst"].items():
            worst[int(seq)] = max(ms, worst.get(int(seq), 0.0))
    got = sum(r["got"] for r in results)
    return {
        "n": n_clients,
        "deliveries": len(latencies),
        "got": got,
        "expected": n_clients * events,
        "rate": len(latencies) / elapsed,
        "p50": pct(latencies, 0.5),
        "p95": pct(latencies, 0.95),
        "p99": pct(latencies, 0.99),
        "cut": sum(r["cut"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "gw_cpu": sum(gw_cpu),
        "gen_cpu": sum(r["cpu"] for r in results),
        "pub_cpu": pub_cpu,
        "procs": len(workers),
        "short": [x for r in results for x in r["short"]],
        "n_short": sum(r["n_short"] for r in results),
        "missing": missing,
        "lost": lost,
        "early": early,
        "dups": sum(r["dups"] for r in results),
        "disorder": sum(r["disorder"] for r in results),
        "slowest": sorted(worst.items(), key=lambda kv: -kv[1])[:5],
    }


async def run_raw(events: int, rate: float, url: str) -> dict:
    nc = await nats.connect(url)
    subj = f"bench.raw.{uuid.uuid4().hex}"
    latencies: list[float] = []
    got = asyncio.Event()

    async def cb(msg) -> None:  # type: ignore[no-untyped-def]
        latencies.append((time.time_ns() - int(msg.data)) / 1e6)
        if len(latencies) >= events:
            got.set()

    await nc.subscribe(subj, cb=cb)
    t0 = time.perf_counter()
    for i in range(events):
        await nc.publish(subj, str(time.time_ns()).encode())
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    await asyncio.wait_for(got.wait(), 30)
    elapsed = time.perf_counter() - t0
    await nc.close()
    return {
        "n": 1,
        "deliveries": len(latencies),
        "expected": events,
        "rate": len(latencies) / elapsed,
        "p50": pct(latencies, 0.5),
        "p95": pct(latencies, 0.95),
        "p99": pct(latencies, 0.99),
    }


async def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"gateway on port {port} did not start")


def shortfalls(r: dict) -> list[str]:
    """Why a row failed: every way a client did not get every event once and in order."""
    why = []
    got = r.get("got", r["deliveries"])
    if got < r["expected"]:
        why.append(f"{r['expected'] - got} event deliveries missing")
    if r.get("lost"):
        why.append(f"{r['lost']} missed event(s) published after their client joined: lost by the gateway")
    if r.get("early"):
        why.append(
            f"{r['early']} missed event(s) published before their client joined: the run started too early"
        )
    for key, what in (
        ("dups", "duplicate deliveries"),
        ("disorder", "deliveries out of order"),
        ("cut", "client(s) cut"),
        ("failed", "client(s) refused"),
    ):
        if r.get(key):
            why.append(f"{r[key]} {what}")
    return why


def relay_warnings(log: str, offset: int) -> list[str]:
    """The SSE relay's warnings a gateway logged after ``offset`` (recoveries, restarts, resets)."""
    with open(log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    return [line[:300] for line in lines if "relay" in line or "consumer" in line.lower()]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="events per second published")
    ap.add_argument("--clients", default="1,100,1000")
    ap.add_argument("--gateways", default="1,2", help="gateway processes per run (comma-separated)")
    ap.add_argument("--client-procs", type=int, default=0, help="load generator processes (0: 1 per 500)")
    ap.add_argument("--limit-ms", type=float, default=100.0, help="p99 publish→delivery limit (issue 14)")
    args = ap.parse_args()
    token = "kt_bench-" + uuid.uuid4().hex
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "KARIOS_DEV_MODE": "1",
        "KARIOS_BUS_PREFIX": prefix,
        "KARIOS_BOOTSTRAP_ADMIN_TOKEN": token,
        "KARIOS_LOG_LEVEL": "WARNING",
    }
    env.setdefault("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
    env.setdefault("KARIOS_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/karios_bench")
    settings = KariosSettings(
        dev_mode=True,
        nats_url=env["KARIOS_NATS_URL"],
        database_url=env["KARIOS_DATABASE_URL"],
        bus_prefix=prefix,
    )
    rows: list[tuple[str, dict]] = []
    load0 = os.getloadavg()[0]
    logdir = tempfile.mkdtemp(prefix="sse-bench-")
    try:
        rows.append(("raw nats-py pub→sub", await run_raw(args.events, args.rate, env["KARIOS_NATS_URL"])))
        for n_gw in [int(x) for x in args.gateways.split(",")]:
            ports = [free_port() for _ in range(n_gw)]
            logs = [os.path.join(logdir, f"gw{n_gw}-{k}.log") for k in range(n_gw)]
            gws = []
            try:
                for port, log in zip(ports, logs, strict=True):  # one at a time: they migrate one database
                    cmd = [sys.executable, "-m", "karios.cli", "run", "api-gateway", "--port", str(port)]
                    with open(log, "wb") as out:
                        gws.append(
                            subprocess.Popen(
                                cmd,
                                env=env,
                                stdout=out,
                                stderr=subprocess.STDOUT,
                            )
                        )
                    await wait_listening(port)
                await asyncio.sleep(1.0)
                procs = [psutil.Process(g.pid) for g in gws]
                for n in [int(x) for x in args.clients.split(",")]:
                    offsets = [os.path.getsize(log) for log in logs]
                    r = await run_sse(
                        n, args.events, args.rate, ports, procs, settings, token, args.client_procs
                    )
                    if shortfalls(r):
                        r["warnings"] = {
                            k: relay_warnings(log, off)
                            for k, (log, off) in enumerate(zip(logs, offsets, strict=True))
                        }
                    rows.append((f"SSE, {n} client(s), {n_gw} gw", r))
            finally:
                for g in gws:
                    g.terminate()
                for g in gws:
                    try:
                        g.wait(30)
                    except subprocess.TimeoutExpired:
                        g.kill()
    finally:
        nc = await nats.connect(env["KARIOS_NATS_URL"])
        js = nc.jetstream()
        for s in ("CMD", "EVT", "DLQ"):
            with contextlib.suppress(Exception):
                await js.delete_stream(f"{prefix.upper()}_{s}")
        await nc.close()
    print(
        f"\nEvent pipeline, {args.events} events at {args.rate:.0f}/s published, {os.cpu_count()} CPUs,"
        f" load average {load0:.1f} → {os.getloadavg()[0]:.1f} (other work on the machine skews the tail)\n"
    )
    limit = f"p99/{args.limit_ms:.0f}ms"
    print(
        f"| {'path':28s} | {'delivered':>15s} | {'cut':>4s} | {'deliv/s':>7s} | {'p50 ms':>7s} |"
        f" {'p95 ms':>7s} | {'p99 ms':>7s} | {limit:>10s} | {'gw CPU':>6s} | {'load gen CPU':>12s} |"
        f" {'pub CPU':>7s} |"
    )
    print(
        f"|{'-' * 30}|{'-' * 17}|{'-' * 6}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 12}|{'-' * 8}|"
        f"{'-' * 14}|{'-' * 9}|"
    )
    for name, r in rows:
        delivered = f"{r.get('got', r['deliveries']):>7d}/{r['expected']:<7d}"
        if "gw_cpu" in r:
            gen = f"{r['gen_cpu'] * 100:>5.0f}% ({r['procs']}p)"
            cpu = f" {r['gw_cpu'] * 100:>5.0f}% | {gen:>12s} | {r['pub_cpu'] * 100:>6.0f}% |"
        else:
            cpu = f" {'':>6s} | {'':>12s} | {'':>7s} |"
        print(
            f"| {name:28s} | {delivered} | {r.get('cut', 0):>4d} | {r['rate']:>7.0f} | {r['p50']:>7.2f} |"
            f" {r['p95']:>7.2f} | {r['p99']:>7.2f} | {r['p99'] / args.limit_ms:>10.2f} |{cpu}"
            + (" **FAILED**" if shortfalls(r) else "")
        )
    for name, r in rows:
        if r.get("slowest"):
            slow = ", ".join(f"#{seq} {ms:.0f} ms" for seq, ms in r["slowest"])
            print(f"{name}: slowest events (last delivery): {slow}")
        if r.get("failed"):
            print(f"{name}: {r['failed']} client(s) refused when connecting (their events count as missing)")
        if r.get("n_short"):
            short = f"{r['n_short']} client(s) short of every event (gateway, got, connected)"
            print(f"{name}: {short}: {r['short']}")
        if r.get("missing"):
            missed = ", ".join(
                f"#{seq} by {count} client(s) of gateway {gw}"
                for (gw, seq), count in sorted(r["missing"].items(), key=lambda kv: kv[0][::-1])[:20]
            )
            print(f"{name}: events never received: {missed}")
        for gw, lines in r.get("warnings", {}).items():
            for line in lines[:20]:
                print(f"{name}: gateway {gw} logged: {line}")
    failed = [(name, why) for name, r in rows if (why := shortfalls(r))]
    for name, why in failed:
        print(f"FAILED {name}: {'; '.join(why)} (every client must get every event once, in order)")
    print("p99/limit <= 1 meets the limit (publish→delivery). CPU: 100% = one core, while publishing;")
    print("load generator and publisher run in processes of their own, the gateway(s) in theirs.")
    if failed:
        print(f"gateway logs: {logdir}")
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:  # the fast loop for the gateway's load generator and publisher too
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _ports, _n, _events, _token, _timeout = sys.argv[2:7]
        asyncio.run(
            worker_main([int(p) for p in _ports.split(",")], int(_n), int(_events), _token, float(_timeout))
        )
    else:
        sys.exit(asyncio.run(main()))
