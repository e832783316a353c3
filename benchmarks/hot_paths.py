"""Hot paths against their limits (issue 14, item 5), each row with its ratio to the limit.

    uv run python benchmarks/hot_paths.py [--seconds 10] [--nodes 10000] [--sse]

Runs ``karios up`` (embedded NATS; a fresh database on the PostgreSQL of
``KARIOS_BENCH_PG``, default 127.0.0.1:5432, dropped at the end) with a file inventory of 100
hosts, and measures with ``wrk`` (Debian: ``apt-get install wrk nginx-light``, installed here if
missing) so that the load generator is not Python:

1. bootapi cached ``/ipxe/<mac>`` vs nginx serving the same bytes as a static file, 200
   connections: limit >= 0.25x nginx and p99 < 25 ms. 1b: the same bootapi (boot_storm's fake
   inventory on the shared NATS) under each ``BOOTAPI_SERVER`` (uvicorn, granian), with and
   without its ``/ipxe`` fast path (``BootapiApp.ipxe_fast_path``), against nginx in the same run.
2. gateway authenticated reads, 100 connections: ``/controlnode/tokens/self`` (the auth path
   alone), ``/controlnode/provision/queue`` and ``/controlnode/nodes`` (auth + a bus query, shared
   for 250 ms): limit p99 < 50 ms. Rows "1 connection": the service time of one request without
   queueing. Measured on the gateway of ``karios up`` (granian, fast reads on) and on a second
   replica under each ``--gateway-configs`` (server and fast reads on/off, by default
   ``uvicorn:plain,granian:plain,granian:fast``).
3. 10,000 registered nodes: ``/controlnode/nodes`` first and last page (limit=100) and a point
   lookup, at 100 nodes (registered through the API) and at 10,000 (the rest inserted in SQL):
   limit p99 at 10k <= 1.5x p99 at 100 (noise on a shared machine).
4. ``--sse``: ``benchmarks/sse_pipeline.py --rate 10 --clients 1000`` (its own process).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repo root: benchmarks.launch

from benchmarks.launch import KariosUp, ensure_debian_tools, free_port, sql  # noqa: E402


def mac_of(i: int) -> str:
    return f"52:54:02:00:{(i >> 8) & 255:02x}:{i & 255:02x}"


def ensure_tools() -> None:
    ensure_debian_tools(("wrk", "/usr/bin/wrk"), ("nginx-light", "/usr/sbin/nginx"))


def wrk(url: str, conns: int, seconds: int, token: str | None = None) -> dict[str, float]:
    """requests/s, p50/p99 ms and non-2xx count of ``wrk -t2 --latency``."""
    argv = ["wrk", f"-t{min(2, conns)}", f"-c{conns}", f"-d{seconds}s", "--latency", "--timeout", "5s"]
    if token:
        argv += ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout

    def ms(q: str) -> float:
        m = re.search(rf"^\s*{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": ms("50"),
        "p99": ms("99"),
        "errors": int(errors.group(1)) if errors else 0,
        "sock": sum(int(x) for x in sock.groups()) if sock else 0,
    }


class Nginx:
    """nginx serving one directory on a free port (its own config, pid and temp paths)."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="karios-nginx-"))
        self.dir.chmod(0o755)
        self.port = free_port()
        conf = self.dir / "nginx.conf"
        temp = " ".join(
            f"{k} {self.dir}/{k};" for k in ("client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path")
        )
        conf.write_text(
            f"daemon off; worker_processes auto; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log;\n"
            "events { worker_connections 4096; }\n"
            f"http {{ access_log off; {temp} uwsgi_temp_path {self.dir}/u; scgi_temp_path {self.dir}/s;\n"
            f"  server {{ listen 127.0.0.1:{self.port}; root {root}; default_type text/plain; }} }}\n"
        )
        self.proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(conf)])
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGQUIT)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class System(KariosUp):
    """``karios up`` on free ports, a file inventory of 100 hosts, a database of its own."""

    def __init__(self, hosts: int = 100) -> None:
        devices = [
            {
                "id": i + 1,
                "name": f"hot-{i:03d}",
                "oob_ip": f"10.97.{i >> 8}.{i & 255}",
                "platform": "debian-12",
                "interfaces": [{"name": "eno1", "macs": [mac_of(i)]}],
            }
            for i in range(hosts)
        ]
        super().__init__("hot", {"devices": devices})


ROW = "| {:<44} | {:>8} | {:>7} | {:>7} | {:>7} | {:<22} | {:>6} |"


def header(title: str) -> None:
    print(f"\n{title}\n")
    print(ROW.format("path", "req/s", "p50 ms", "p99 ms", "errors", "limit", "ratio"))
    print(ROW.format(*(["-" * 44, "-" * 8, "-" * 7, "-" * 7, "-" * 7, "-" * 22, "-" * 6])).replace(" ", "-"))


def row(name: str, r: dict[str, float], limit: str = "", ratio: float | None = None) -> None:
    ratio_s = f"{ratio:.2f}" if ratio is not None else ""
    errs = f"{int(r['errors'] + r['sock'])}"
    print(ROW.format(name, f"{r['rps']:.0f}", f"{r['p50']:.1f}", f"{r['p99']:.1f}", errs, limit, ratio_s))


def nginx_static(body: bytes, secs: int) -> dict[str, float]:
    """wrk against nginx serving ``body`` as a static file, 200 connections."""
    static = Path(tempfile.mkdtemp(prefix="karios-static-"))
    static.chmod(0o755)
    (static / "ipxe").write_bytes(body)
    (static / "ipxe").chmod(0o644)
    nginx = Nginx(static)
    try:
        return wrk(f"http://127.0.0.1:{nginx.port}/ipxe", 200, secs)
    finally:
        nginx.stop()
        shutil.rmtree(static, ignore_errors=True)


def bench_ipxe(s: System, secs: int) -> None:
    url = f"{s.url('BOOTAPI')}/ipxe/{mac_of(7)}"
    body = httpx.get(url, timeout=30).content  # the first request fills the cache
    assert b"#!ipxe" in body, body[:200]
    server = httpx.get(url, timeout=30).headers.get("server", "?")
    ng = nginx_static(body, secs)
    ip = wrk(url, 200, secs)
    hz = wrk(f"{s.url('BOOTAPI')}/healthz", 200, secs)
    header(
        f"1. bootapi cached /ipxe ({len(body)} bytes, served by {server}) vs nginx, 200 connections, "
        f"wrk -t2, {secs} s each"
    )
    row("nginx static file (worker_processes auto)", ng)
    row("bootapi /healthz", hz, "", hz["rps"] / ng["rps"])
    row("bootapi /ipxe/<mac> cached: req/s vs nginx", ip, ">= 0.25x nginx", ip["rps"] / ng["rps"] / 0.25)
    row("bootapi /ipxe/<mac> cached: p99", ip, "p99 < 25 ms", ip["p99"] / 25)
    print("ratio: measured / limit (req/s: >= 1 meets it; p99: <= 1 meets it)")


def serve_bootapi(prefix: str, port: int, server: str, fast_path: bool) -> None:
    """(child process) bootapi on boot_storm's fake inventory: BOOTAPI_SERVER=``server``, with or
    without its ``/ipxe`` fast path; served as ``karios run bootapi`` serves it (listeners.py)."""
    import logging

    sys.path.insert(0, str(HERE))
    import boot_storm

    from karios.bootapi.listeners import GranianListener, build_servers, run_servers
    from karios.bootapi.settings import BootapiSettings

    boot = BootapiSettings(_env_file=None, listen_addr=f"127.0.0.1:{port}", server=server)  # type: ignore[call-arg]
    servers = build_servers(boot_storm.settings(prefix), boot)
    first = servers[0]
    app = first.app if isinstance(first, GranianListener) else first.config.app  # type: ignore[attr-defined]
    app.ipxe_fast_path = fast_path
    logging.getLogger("faststream").setLevel(logging.WARNING)
    asyncio.run(run_servers(servers))


IPXE_CONFIGS = (("uvicorn", False), ("uvicorn", True), ("granian", False), ("granian", True))


def bench_ipxe_ab(secs: int, configs: tuple[tuple[str, bool], ...] = IPXE_CONFIGS) -> None:
    """The same bootapi under each server, with and without the fast path, one after the other on
    the shared NATS, against nginx serving the same bytes in the same run."""
    prefix, ready = f"hot{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp()) / "ready"
    more = ["--hosts", "100", "--ready", str(ready)]
    inv = subprocess.Popen(
        [sys.executable, str(HERE / "boot_storm.py"), "--role", "inventory", "--prefix", prefix, *more],
        stdout=subprocess.DEVNULL,
    )
    rows = []
    body = b""
    try:
        while not ready.exists() and inv.poll() is None:
            time.sleep(0.1)
        for server, fast in configs:
            port = free_port()
            argv = [sys.executable, __file__, "--serve-bootapi", prefix, str(port), server, str(int(fast))]
            api = subprocess.Popen(argv)
            try:
                url = f"http://127.0.0.1:{port}/ipxe/52:54:01:00:00:07"
                for _ in range(300):
                    try:
                        body = httpx.get(url, timeout=5).content
                        break
                    except httpx.HTTPError:
                        time.sleep(0.1)
                name = f"/ipxe, {server}, {'with' if fast else 'without'} fast path"
                rows.append((name, wrk(url, 200, secs)))
            finally:
                api.send_signal(signal.SIGTERM)
                api.wait(30)
    finally:
        inv.terminate()
        inv.wait(10)
    assert b"#!ipxe" in body, body[:200]
    ng = nginx_static(body, secs)
    header(
        f"1b. bootapi /ipxe by server and fast path vs nginx ({len(body)} bytes), 200 connections, "
        f"wrk -t2, {secs} s each"
    )
    row("nginx static file (worker_processes auto)", ng)
    for name, r in rows:
        row(f"{name}: req/s", r, ">= 0.25x nginx", r["rps"] / ng["rps"] / 0.25)
        row(f"{name}: p99", r, "p99 < 25 ms", r["p99"] / 25)
    print("ratio: measured / limit (req/s: >= 1 meets it; p99: <= 1 meets it)")


def gateway_rows(gw: str, token: str, secs: int) -> list[tuple[str, dict[str, float], int | None]]:
    one = max(3, secs // 2)
    return [
        ("/healthz (no auth)", wrk(f"{gw}/healthz", 100, secs), None),
        ("/healthz, 1 connection", wrk(f"{gw}/healthz", 1, one), None),
        ("/controlnode/tokens/self, 1 connection", wrk(f"{gw}/controlnode/tokens/self", 1, one, token), None),
        ("/controlnode/tokens/self (auth only)", wrk(f"{gw}/controlnode/tokens/self", 100, secs, token), 50),
        (
            "/controlnode/provision/queue (auth + bus)",
            wrk(f"{gw}/controlnode/provision/queue", 100, secs, token),
            50,
        ),
        ("/controlnode/nodes (auth + bus)", wrk(f"{gw}/controlnode/nodes", 100, secs, token), 50),
    ]


#: Second gateway replicas of section 2: (HTTP server, fast reads). The gateway of ``karios up``
#: is (granian, fast reads on: the default).
GATEWAY_CONFIGS = (("uvicorn", False), ("granian", False), ("granian", True))


def serve_gateway(port: int, server: str, fast: bool) -> None:
    """(child process) a gateway replica served as ``karios run api-gateway`` serves it
    (cli/main.py; ``--server``/``KARIOS_RUN_SERVER``), with or without its fast reads
    (``create_app(fast_reads=...)``, api_gateway/fastpath.py)."""
    import uvicorn

    from karios.api_gateway.app import create_app
    from karios.bootapi.listeners import GranianListener, run_servers
    from karios.common.settings import KariosSettings

    settings = KariosSettings()
    app = create_app(settings, fast_reads=fast)
    if server == "granian":
        asyncio.run(run_servers([GranianListener(app, settings.host, port, lifespan=True, threads=2)]))
        return
    uvicorn.run(
        app,
        host=settings.host,
        port=port,
        log_level="warning",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=5,
    )


def second_gateway(s: System, server: str, fast: bool) -> tuple[subprocess.Popen[bytes], str]:
    """A second gateway replica on the same system (NATS, database) under ``server``, with or
    without fast reads (:func:`serve_gateway`)."""
    port = free_port()
    listening = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{s.ports['GATEWAY']}"], capture_output=True, text=True, check=True
    ).stdout
    pid = re.search(r"pid=(\d+)", listening).group(1)  # type: ignore[union-attr]
    # The first replica's environment as ``karios up`` made it (its generated secret key included).
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-gateway", str(port), server, str(int(fast))],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"a gateway under {server} did not become ready")


def bench_gateway(s: System, secs: int, configs: tuple[tuple[str, bool], ...] = GATEWAY_CONFIGS) -> None:
    """The gateway of ``karios up`` (granian, ``karios run``'s default for it, fast reads on), then a second
    replica under each of ``configs`` (server, fast reads): what the server and the fast path
    alone change."""
    url = s.url("GATEWAY")
    rows = [(f"{name} [karios up]", r, lim) for name, r, lim in gateway_rows(url, s.token, secs)]
    for server, fast in configs:
        proc, url = second_gateway(s, server, fast)
        try:
            served = httpx.get(f"{url}/healthz", timeout=5).headers.get("server", server)  # what answered
            tag = f"[{served}{'' if fast else ', no fast path'}]"
            rows += [(f"{name} {tag}", r, lim) for name, r, lim in gateway_rows(url, s.token, secs)]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    header(f"2. gateway authenticated reads, 100 connections, {secs} s each")
    for name, r, lim in rows:
        row(name, r, f"p99 < {lim} ms" if lim else "", r["p99"] / lim if lim else None)
    print(
        "ratio: p99 / limit (<= 1 meets it). [server]: the HTTP server of that gateway replica; "
        "'no fast path': every read through FastAPI (create_app(fast_reads=False))"
    )


async def register(s: System, n: int) -> float:
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(20)
    async with httpx.AsyncClient(
        base_url=s.url("GATEWAY"), headers={"Authorization": f"Bearer {s.token}"}
    ) as c:

        async def one(i: int) -> None:
            body = {
                "bmc_ip": f"10.98.{i >> 8}.{i & 255}",
                "os_ip": f"10.99.{i >> 8}.{i & 255}",
                "vendor": "generic",
            }
            async with sem:
                r = await c.post("/controlnode/register", json=body, timeout=30)
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


def node_reads(s: System, n: int, secs: int) -> dict[str, dict[str, float]]:
    gw = s.url("GATEWAY")
    last = max(0, n - 100)
    return {
        "first page (limit=100)": wrk(f"{gw}/controlnode/nodes?limit=100", 100, secs, s.token),
        "last page (offset=n-100)": wrk(
            f"{gw}/controlnode/nodes?offset={last}&limit=100", 100, secs, s.token
        ),
        "one node (/nodes/{ip})": wrk(f"{gw}/controlnode/nodes/10.99.0.50", 100, secs, s.token),
    }


def bench_nodes(s: System, nodes: int, secs: int) -> None:
    reg_rate = asyncio.run(register(s, 100))
    small = node_reads(s, 100, secs)
    rest = nodes - 100
    asyncio.run(
        sql(
            s.db_url,
            "INSERT INTO inventory.bmc_infos (bmc_ip, os_ip, os_hostname, vendor, is_control_node, "
            "created_at, updated_at) SELECT '10.100.' || (g >> 8) || '.' || (g & 255), "
            "'10.101.' || (g >> 8) || '.' || (g & 255), 'bulk-' || g, 'generic', false, now(), now() "
            f"FROM generate_series(0, {rest - 1}) g",
        )
    )
    large = node_reads(s, nodes, secs)
    header(f"3. /controlnode/nodes at 100 vs {nodes} registered nodes, 100 connections, {secs} s each")
    for name in small:
        row(f"{name}, 100 nodes", small[name])
        ratio = large[name]["p99"] / small[name]["p99"] if small[name]["p99"] else float("nan")
        row(f"{name}, {nodes} nodes", large[name], "p99 <= 1.5x at 100", ratio / 1.5)
    print(f"(100 nodes registered through POST /controlnode/register at {reg_rate:.0f}/s; the rest in SQL)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument(
        "--sse", action="store_true", help="also run sse_pipeline.py at 10 events/s, 1000 clients"
    )
    ap.add_argument("--only", default="ipxe,ipxe-ab,gateway,nodes")
    ap.add_argument(
        "--gateway-configs",
        default=",".join(f"{srv}:{'fast' if fast else 'plain'}" for srv, fast in GATEWAY_CONFIGS),
        help="section 2 also measures a second gateway replica under each SERVER:fast|plain "
        "(comma-separated; '' none)",
    )
    ap.add_argument("--serve-bootapi", nargs=4, help=argparse.SUPPRESS)  # PREFIX PORT SERVER FAST (child)
    ap.add_argument("--serve-gateway", nargs=3, help=argparse.SUPPRESS)  # PORT SERVER FAST (child)
    a = ap.parse_args()
    if a.serve_gateway:
        serve_gateway(int(a.serve_gateway[0]), a.serve_gateway[1], a.serve_gateway[2] == "1")
        return
    if a.serve_bootapi:
        serve_bootapi(
            a.serve_bootapi[0], int(a.serve_bootapi[1]), a.serve_bootapi[2], a.serve_bootapi[3] == "1"
        )
        return
    ensure_tools()
    only = set(a.only.split(","))
    if "ipxe-ab" in only:
        bench_ipxe_ab(a.seconds)
    if not only & {"ipxe", "gateway", "nodes"}:
        return
    s = System()
    try:
        print(f"karios up ready; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        if "ipxe" in only:
            bench_ipxe(s, a.seconds)
        if "gateway" in only:
            configs = [c.split(":") for c in a.gateway_configs.split(",") if c]
            bench_gateway(s, a.seconds, tuple((srv, mode == "fast") for srv, mode in configs))
        if "nodes" in only:
            bench_nodes(s, a.nodes, a.seconds)
    finally:
        s.stop()
    if a.sse:
        cmd = [sys.executable, str(HERE / "sse_pipeline.py"), "--rate", "10", "--events", "100"]
        subprocess.run([*cmd, "--clients", "1000", "--limit-ms", "100"], check=False)


if __name__ == "__main__":
    main()
