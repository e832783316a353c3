"""Boot storm: 10,000 known MACs, 200 concurrent clients, uncached vs cached, beside /healthz.

    uv run python benchmarks/boot_storm.py [--hosts 10000] [--clients 200]

Three processes on the real NATS (``KARIOS_NATS_URL``, default 127.0.0.1:4222): a fake inventory
answering ``q.inventory.host`` from an in-memory table, bootapi (uvicorn, one worker), and this
load generator (raw HTTP/1.1 keep-alive connections: httpx would be the bottleneck). Phases:
``/healthz`` (a trivial plain-text endpoint of the same server), ``/ipxe`` cold (every MAC
once: each request goes over the bus), ``/ipxe`` warm (the same MACs from the cache), ``/healthz``
again. On a noisy machine the ratio ipxe/healthz is the figure that matters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid

MAC_PREFIX = "52:54:01"


def mac_of(i: int) -> str:
    return f"{MAC_PREFIX}:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}"


def settings(prefix: str):  # type: ignore[no-untyped-def]
    from karios.common.settings import KariosSettings

    return KariosSettings(
        dev_mode=True,
        bus_prefix=prefix,
        log_json=False,
        log_level="WARNING",
        nats_url=os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222"),
    )


async def run_inventory(prefix: str, hosts: int, ready: str) -> None:
    from karios.common.bus.runtime import Bus
    from karios.common.contracts.inventory import Host, HostInterface, HostQuery
    from karios.common.errors import NotFound

    table = {
        mac_of(i): Host(
            id=i,
            name=f"node-{i:05d}.storm.example",
            platform="almalinux-9",
            interfaces=[HostInterface(name="eno1", macs=[mac_of(i)])],
        ).model_dump(mode="json")
        for i in range(hosts)
    }

    async def host(q: HostQuery) -> dict:
        found = table.get(q.mac or "")
        if found is None:
            raise NotFound("no such MAC")
        return found

    bus = Bus.from_settings(settings(prefix), "inventory")
    bus.query_responder(bus.subjects.query("inventory", "host"), HostQuery, host)
    await bus.start()
    logging.getLogger("faststream").setLevel(logging.WARNING)  # no access log line per request
    with open(ready, "w") as f:
        f.write("ready")
    await asyncio.Event().wait()


def run_bootapi(prefix: str, port: int) -> None:
    import uvicorn

    from karios.bootapi.app import create_app
    from karios.bootapi.settings import BootapiSettings

    app = create_app(settings(prefix), BootapiSettings(_env_file=None))  # type: ignore[call-arg]
    logging.getLogger("faststream").setLevel(logging.WARNING)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, path: str) -> int:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        return status


async def phase(port: int, clients: int, paths: list[str], expect: bytes | None = None) -> dict:
    conns = [Conn(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(clients)]
    latencies: list[float] = []
    errors = 0
    queue = iter(paths)

    async def worker(c: Conn) -> None:
        nonlocal errors
        for path in queue:
            t0 = time.perf_counter()
            status = await c.get(path)
            latencies.append(time.perf_counter() - t0)
            errors += status != 200

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - started
    for c in conns:
        c.writer.close()
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def metric(port: int, name: str) -> float:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
    body = (await r.read()).decode()
    w.close()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


async def bench(hosts: int, clients: int) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    port = free_port()
    me = [sys.executable, __file__]
    ready = f"/tmp/{prefix}.ready"
    inv = subprocess.Popen(
        [*me, "--role", "inventory", "--prefix", prefix, "--hosts", str(hosts), "--ready", ready],
        stdout=subprocess.DEVNULL,
    )
    api = None
    try:
        for _ in range(300):
            if os.path.exists(ready) or inv.poll() is not None:
                break
            time.sleep(0.1)
        api = subprocess.Popen([*me, "--role", "bootapi", "--prefix", prefix, "--port", str(port)])
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        macs = [f"/ipxe/{mac_of(i)}" for i in range(hosts)]
        rows = [
            ("/healthz (plain text)", await phase(port, clients, ["/healthz"] * hosts)),
            ("/ipxe uncached (bus lookup)", await phase(port, clients, macs)),
            ("/ipxe cached", await phase(port, clients, macs)),
            ("/healthz again", await phase(port, clients, ["/healthz"] * hosts)),
        ]
        misses = await metric(port, "bootapi_netbox_cache_misses_total")
    finally:
        for p in (api, inv):
            if p is not None:
                p.send_signal(signal.SIGINT)
                p.wait(10)
    base = (rows[0][1]["rps"] + rows[3][1]["rps"]) / 2
    print(f"\n{hosts} known MACs, {clients} concurrent keep-alive clients, one bootapi process\n")
    print(
        f"| {'phase':<28} | {'requests':>8} | {'errors':>6} | {'req/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} |"
        f" {'vs healthz':>10} |"
    )
    print(f"|{'-' * 30}|{'-' * 10}|{'-' * 8}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 12}|")
    for name, r in rows:
        print(
            f"| {name:<28} | {r['requests']:>8} | {r['errors']:>6} | {r['rps']:>8.0f} | {r['p50']:>7.1f} |"
            f" {r['p99']:>7.1f} | {r['rps'] / base:>10.2f} |"
        )
    print(f"\ninventory lookups (cache misses): {misses:.0f} for {2 * hosts} /ipxe requests")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--role", choices=["bench", "inventory", "bootapi"], default="bench")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ready", default="")
    a = ap.parse_args()
    if a.role == "inventory":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_inventory(a.prefix, a.hosts, a.ready))
    elif a.role == "bootapi":
        run_bootapi(a.prefix, a.port)
    else:
        asyncio.run(bench(a.hosts, a.clients))


if __name__ == "__main__":
    main()
