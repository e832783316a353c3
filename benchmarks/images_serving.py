"""``/images`` and ``/media`` throughput vs nginx serving the same bytes (issue 25, item 6).

    uv run python benchmarks/images_serving.py [--seconds 8] [--size-mib 256] [--clients 1,10,40]
        [--rounds 3] [--servers uvicorn] [--limit 0.8]

What runs, in one process tree and one run:

- the provisioner as production runs it: ``karios run provisioner`` (uvicorn on uvloop and
  httptools; ``--servers uvicorn,granian`` also measures it under granian, where no zero copy is
  offered and the response streams), on an embedded NATS and a fresh database on the PostgreSQL
  of ``KARIOS_BENCH_PG`` (default 127.0.0.1:5432, dropped at the end);
- ``/images/bench/rootfs.tar``: a ``--size-mib`` file of random bytes under its images directory;
- ``/media/<job>.iso``: a medium of the same size with a slot (``MediaBuilder``'s records: a base
  in ``media-base/``, the job's ``.slot`` with a real overlay payload), fetched by its signed URL
  (a job row in ``booting``, as a BMC fetches it);
- nginx (``apt-get install nginx-light``; ``sendfile on`` as Debian ships it, or
  ``--nginx-sendfile off``; ``worker_processes auto``) serving the same image file and the
  patched medium written out as a file;
- ``wrk`` (``apt-get install wrk``) as the load: ``-c N`` connections, each downloading the whole
  file again and again; the bytes wrk read (partial downloads included) over its duration.

Before measuring, whole downloads and ranges across the slot's edges are checked byte for byte
against the file (and the medium against ``ServedMedium.read``). Each measurement alternates
nginx and the service ``--rounds`` times (a shared machine drifts): MiB/s is the median of the
rounds, the ratio the median of each round's service / nginx, PASS when it is >= ``--limit``.
CPU: seconds of server CPU (user + system, every nginx process) per GiB served.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

MIB = 1 << 20
JOB = "bench-media"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_tools() -> None:
    tools = (("wrk", "/usr/bin/wrk"), ("nginx-light", "/usr/sbin/nginx"))
    missing = [pkg for pkg, exe in tools if not Path(exe).exists()]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, capture_output=True)


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def wrk(url: str, conns: int, seconds: int, pids: list[int]) -> dict[str, float]:
    """MiB/s wrk read (partial downloads included), errors, and server CPU s/GiB."""
    argv = ["wrk", f"-t{min(2, conns)}", f"-c{conns}", f"-d{seconds}s", "--timeout", "60s", url]
    t0 = cpu_ticks(pids)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    ticks = cpu_ticks(pids) - t0
    m = re.search(r"requests in ([\d.]+)(us|ms|s|m), ([\d.]+)([KMGT]?B) read", out)
    if not m:
        raise SystemExit(f"wrk said:\n{out}")
    secs = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]
    read = float(m.group(3)) * {"B": 1, "KB": 1 << 10, "MB": MIB, "GB": 1 << 30, "TB": 1 << 40}[m.group(4)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    cpu = ticks / os.sysconf("SC_CLK_TCK")
    return {
        "mibs": read / MIB / secs,
        "errors": (int(errors.group(1)) if errors else 0) + (sum(map(int, sock.groups())) if sock else 0),
        "cpu_per_gib": cpu / (read / (1 << 30)) if read else float("nan"),
    }


class Nginx:
    """nginx serving one directory on a free port (its own config, pid and temp paths)."""

    def __init__(self, root: Path, sendfile: str = "on") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="karios-nginx-"))
        self.dir.chmod(0o755)
        self.port = free_port()
        temp = " ".join(
            f"{k}_temp_path {self.dir}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        (self.dir / "nginx.conf").write_text(
            f"daemon off; worker_processes auto; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log;\n"
            "events { worker_connections 4096; }\n"
            f"http {{ access_log off; sendfile {sendfile}; tcp_nopush on; {temp}\n"
            f"  server {{ listen 127.0.0.1:{self.port}; root {root};\n"
            "    default_type application/octet-stream; } }\n"
        )
        self.proc = subprocess.Popen(
            [shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(self.dir / "nginx.conf")]
        )
        wait_port(self.port, self.proc)

    @property
    def pids(self) -> list[int]:
        kids = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout.split()
        return [self.proc.pid, *map(int, kids)]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGQUIT)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {timeout} s")


def random_file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 * MIB)
            f.write(os.urandom(n))
            left -= n
    path.chmod(0o644)
    return path


class Bench:
    """The files, the embedded NATS, the database and the secret key shared by every server run."""

    def __init__(self, size: int) -> None:
        from karios.cli.embedded import EmbeddedNats
        from karios.provisioner.install import HostContext
        from karios.provisioner.install.preseed import PreseedMethod
        from karios.provisioner.media import MediaBuilder
        from karios.provisioner.media.slot import SLOT_SIZE, BaseLayout, base_key, encode_record, render_slot

        self.root = Path(tempfile.mkdtemp(prefix="karios-images-bench-"))
        self.root.chmod(0o755)
        self.images, self.cache, self.media = self.root / "images", self.root / "cache", self.root / "media"
        self.image = random_file(self.images / "bench" / "rootfs.tar", size)
        # A medium as MediaBuilder.build leaves it: a base ISO (here random bytes of the same size)
        # with its layout, and the job's slot record with a real overlay in it.
        key = base_key({"bench": uuid.uuid4().hex})
        layout = BaseLayout(key, size, (size // 2) // 2048 * 2048 + 1000, SLOT_SIZE)  # not page aligned
        random_file(self.cache / "media-base" / f"{key}.iso", size)
        (self.cache / "media-base" / f"{key}.json").write_text(layout.to_json())
        ctx = HostContext(
            job_id=JOB,
            token="tok-bench-" + "x" * 24,
            callback_base="http://10.0.0.1:8080/controlnode",
            hostname="bench",
            bmc_ip="10.250.9.9",
            os_username="debian",
            password_hash="$6$karios12$x",
            disks=["/dev/sda"],
        )
        payload = render_slot(PreseedMethod().medium(ctx).overlay, SLOT_SIZE)
        self.media.mkdir()
        (self.media / f"{JOB}.slot").write_bytes(
            encode_record(key, payload, str(self.cache / "media-base" / f"{key}.iso"))
        )
        served = MediaBuilder(self.cache, self.media).open(JOB)
        assert served is not None
        self.served = served
        self.static = self.root / "static"  # what nginx serves: the image and the patched medium
        (self.static / "bench").mkdir(parents=True)
        self.static.chmod(0o755)
        os.link(self.image, self.static / "bench" / "rootfs.tar")
        served.write_to(self.static / f"{JOB}.iso").chmod(0o644)
        self.nats = EmbeddedNats(self.root / "nats-state")
        self.nats_url = self.nats.start()
        pg = os.environ.get("KARIOS_BENCH_PG", "postgres@127.0.0.1:5432")
        self.db = f"karios_images_{uuid.uuid4().hex[:8]}"
        self.db_url = f"postgresql+asyncpg://{pg}/{self.db}"
        asyncio.run(sql(self.db_url, f'CREATE DATABASE "{self.db}"', db="postgres"))
        self.secret = base64.b64encode(os.urandom(32)).decode()
        self.prefix = f"img{uuid.uuid4().hex[:8]}"

    def env(self, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
        return env | {
            "KARIOS_DEV_MODE": "1",
            "KARIOS_SECRET_KEY": self.secret,
            "KARIOS_NATS_URL": self.nats_url,
            "KARIOS_DATABASE_URL": self.db_url,
            "KARIOS_BUS_PREFIX": self.prefix,
            "KARIOS_STATE_DIR": str(self.root / "state"),
            "KARIOS_PROVISIONER_PORT": str(port),
            "KARIOS_PROVISIONER_CACHE_DIR": str(self.cache),
            "KARIOS_PROVISIONER_MEDIA_DIR": str(self.media),
            "KARIOS_PROVISIONER_IMAGES_DIR": str(self.images),
            "KARIOS_PROVISIONER_POWER_SYNC_INTERVAL": "0",
            "KARIOS_LOG_LEVEL": "WARNING",
        }

    def media_url(self, base: str) -> str:
        from karios.common.crypto import SecretBox
        from karios.common.settings import KariosSettings
        from karios.provisioner.media.signing import MediaUrlSigner

        settings = KariosSettings(_env_file=None, dev_mode=True, secret_key=self.secret, old_secret_keys={})  # type: ignore[call-arg]
        signer = MediaUrlSigner.from_box(SecretBox.from_settings(settings))
        return signer.url(base, JOB, int(time.time()) + 24 * 3600)

    async def insert_job(self) -> None:
        """The medium's job, ``booting`` under a lease no replica takes over during the run."""
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlmodel.ext.asyncio.session import AsyncSession

        from karios.provisioner.models import Job

        engine = create_async_engine(self.db_url)
        try:
            async with AsyncSession(engine) as s:
                if await s.get(Job, JOB) is None:
                    lease = datetime.now(UTC) + timedelta(days=1)
                    s.add(Job(id=JOB, bmc_ip="10.250.9.9", state="booting", owner="bench", lease_until=lease))
                    await s.commit()
        finally:
            await engine.dispose()

    def stop(self) -> None:
        self.nats.stop()
        asyncio.run(sql(self.db_url, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)', db="postgres"))
        shutil.rmtree(self.root, ignore_errors=True)


async def sql(db_url: str, statement: str, db: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(db_url.rsplit("/", 1)[0] + "/" + db, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as c:
            await c.execute(text(statement))
    finally:
        await engine.dispose()


class Provisioner:
    """``karios run provisioner --server SERVER`` on a free port."""

    def __init__(self, bench: Bench, server: str) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "karios.cli", "run", "provisioner", "--port", str(self.port)]
        argv += ["--server", server]
        self.proc = subprocess.Popen(argv, env=bench.env(self.port))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"karios run provisioner exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the provisioner did not become ready")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def sha256_of(url: str) -> tuple[int, str, str]:
    h = hashlib.sha256()
    with httpx.stream("GET", url, timeout=300) as r:
        for chunk in r.iter_raw(4 * MIB):
            h.update(chunk)
        return r.status_code, h.hexdigest(), r.headers.get("server", "?")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def check(bench: Bench, image_url: str, media_url: str) -> str:
    """Whole files and ranges across the slot's edges, byte for byte; the server header."""
    status, digest, server = sha256_of(image_url)
    assert (status, digest) == (200, file_sha256(bench.image)), ("/images", status)
    status, digest, _ = sha256_of(media_url)
    assert (status, digest) == (200, file_sha256(bench.static / f"{JOB}.iso")), ("/media", status)
    lo, n = bench.served.layout.offset, bench.served.layout.size
    with httpx.Client(timeout=60) as c:
        for a, b in ((lo - 5000, lo + 99), (lo + n - 10, lo + n + 70000), (0, lo + n + 5), (lo + 7, lo + 7)):
            r = c.get(media_url, headers={"Range": f"bytes={a}-{b}"})
            assert r.status_code == 206 and r.content == bench.served.read(a, b), ("/media range", a, b)
            r = c.get(image_url, headers={"Range": f"bytes={a}-{b}"})
            with open(bench.image, "rb") as f:
                f.seek(a)
                assert r.status_code == 206 and r.content == f.read(b - a + 1), ("/images range", a, b)
    return server


ROW = "| {:<7} | {:>7} | {:>7} | {:>7} | {:>5} | {:<14} | {:>9} | {:>9} | {:>6} | {:<6} |"
HEAD = ("path", "clients", "nginx", "service", "ratio", "round ratios", "nginx CPU", "svc CPU")
HEAD += ("errors", "limit")
UNITS = ("", "", "MiB/s", "MiB/s", "", "", "s/GiB", "s/GiB", "", "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=8, help="per wrk run")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--clients", default="1,10,40")
    ap.add_argument("--rounds", type=int, default=3, help="nginx / service alternations per row")
    ap.add_argument("--servers", default="uvicorn", help="comma-separated: uvicorn, granian")
    ap.add_argument("--limit", type=float, default=0.8)
    ap.add_argument("--nginx-sendfile", choices=("on", "off"), default="on", help="nginx's sendfile")
    a = ap.parse_args()
    ensure_tools()
    clients = [int(c) for c in a.clients.split(",")]
    bench = Bench(a.size_mib * MIB)
    nginx = Nginx(bench.static, a.nginx_sendfile)
    failed = False
    try:
        ng_urls = {
            "/images": f"http://127.0.0.1:{nginx.port}/bench/rootfs.tar",
            "/media": f"http://127.0.0.1:{nginx.port}/{JOB}.iso",
        }
        for server in a.servers.split(","):
            prov = Provisioner(bench, server)
            try:
                asyncio.run(bench.insert_job())
                urls = {"/images": f"{prov.url}/images/bench/rootfs.tar", "/media": bench.media_url(prov.url)}
                served_by = check(bench, urls["/images"], urls["/media"])
                for path in urls:  # nginx serves the same bytes
                    assert sha256_of(ng_urls[path])[1] == sha256_of(urls[path])[1], path
                print(
                    f"\nkarios run provisioner --server {server} (server: {served_by}) vs nginx, "
                    f"{a.size_mib} MiB file, nginx sendfile {a.nginx_sendfile}, wrk -t2 -c N -d{a.seconds}s, "
                    f"{a.rounds} rounds; "
                    f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n"
                )
                print(ROW.format(*HEAD))
                print(ROW.format(*UNITS))
                print(ROW.format(*["-" * w for w in (7, 7, 7, 7, 5, 14, 9, 9, 6, 6)]).replace(" ", "-"))
                for path in urls:
                    for c in clients:
                        ng, sv = [], []
                        for _ in range(a.rounds):
                            ng.append(wrk(ng_urls[path], c, a.seconds, nginx.pids))
                            sv.append(wrk(urls[path], c, a.seconds, [prov.proc.pid]))
                        ratios = [s["mibs"] / n["mibs"] for n, s in zip(ng, sv, strict=True)]
                        ratio = statistics.median(ratios)
                        failed |= ratio < a.limit
                        print(
                            ROW.format(
                                path,
                                c,
                                f"{statistics.median(r['mibs'] for r in ng):,.0f}",
                                f"{statistics.median(r['mibs'] for r in sv):,.0f}",
                                f"{ratio:.2f}",
                                " ".join(f"{r:.2f}" for r in ratios),
                                f"{statistics.median(r['cpu_per_gib'] for r in ng):.2f}",
                                f"{statistics.median(r['cpu_per_gib'] for r in sv):.2f}",
                                int(sum(r["errors"] for r in ng + sv)),
                                f"{'PASS' if ratio >= a.limit else 'FAIL'}",
                            ),
                            flush=True,
                        )
            finally:
                prov.stop()
        print(
            "\nratio: median over the rounds of service MiB/s / nginx MiB/s (the nginx run just before); "
            f"limit >= {a.limit}. CPU: server CPU seconds per GiB served"
        )
    finally:
        nginx.stop()
        bench.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
