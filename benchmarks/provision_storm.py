"""1,000 hosts at once (issue 14, item 4), 10,000 on replicas (issue 28, item 3): one
provisioning batch through the gateway(s) onto emulated BMCs, with admission control.

    nice -n 10 uv run python benchmarks/provision_storm.py [--hosts 1000] [--emulators 4]
        [--overall 64] [--per-vendor 32] [--media head|full]
        [--cluster 3 [--replicas N] [--service-replicas SERVICE=N ...]]

    # issue 28 item 3: 3 provisioners and 2 gateways on the 3-node NATS cluster
    nice -n 10 uv run python benchmarks/provision_storm.py --hosts 10000 --cluster 3 \
        --service-replicas provisioner=3 --service-replicas api-gateway=2

``karios up`` (a fresh database on ``KARIOS_BENCH_PG``, dropped at the end) with a file inventory
of N devices. Without ``--cluster`` (default 0): the shared NATS at ``KARIOS_NATS_URL`` (default
nats://127.0.0.1:4222) under a prefix of its own. With ``--cluster N``: ``karios up --cluster N``
starts its own JetStream cluster of N nats-servers (streams R3; ``KARIOS_NATS_URL`` is not
passed, or up would use that server instead) and ``--replicas`` (default 2) processes of every
service, ``--service-replicas SERVICE=N`` overriding one service's count (both also work without
``--cluster``). N fake systems spread over ``--emulators`` sushy-tools processes
(tests/lab/redfish_lab.py, instant power). The batch is N ``POST /controlnode/provision``
sharing one ``parent_id`` (there is no batch endpoint), 32 at a time, vendors round robin (dell,
hpe, supermicro, generic), the POSTs spread round robin over every gateway replica
(``<state>/replicas.json``).

``--media head`` (default): the emulator's InsertMedia fetches the first 64 KiB of the medium
(status and length checked) instead of downloading it whole — stock sushy-tools copies every
54.5 MB ISO into its temp dir and keeps it until eject, i.e. 54 GB for 1,000 booting hosts; a real
BMC reads the medium on demand. ``--media full`` keeps the stock behaviour (use a small N).

Prints: time from the first POST to the last power reset (the job rows' ``reset_at``, and every
emulator saw exactly one reset per system), per-stage percentiles from the JetStream timestamps
of the job events (and, before them, when each 202 came and when the gateway's outbox relay
published the start command, seen by a core NATS subscriber), BMC requests per host (the
emulators' request logs), the provisioner's peak RSS, state-dir / database / event-stream
growth, and the admission limits used; then per gateway replica the POSTs it took, per
provisioner replica the jobs it owns at the end (the job rows' lease ``owner``), whether every
system was reset exactly once (per system, from the emulators' logs), the database growth per
host, and a table of where the CPU and memory go:

- per group of processes (each service summed over its replicas; ``nats-server``: the nodes of
  ``--cluster``; ``emulators``; ``postgresql``: the backends of this run's database when
  PostgreSQL runs on this machine, counted from when each is first seen; ``karios up``: the
  supervisor alone; ``benchmark client``: this process alone): processes, CPU seconds during the
  run (user + system, children it reaped included), CPU ms per host, the busiest process's CPU
  seconds / wall seconds over the run (and in its busiest 5 s), RSS at the start → the peak of
  the group's summed RSS, and that growth per host. Sampled every second in a thread from just
  before the first POST to the last reset; a replica restarted meanwhile counts as a process of
  its own.
- ``machine: X % of N CPUs busy``: the whole machine over the run (``psutil.cpu_times``), and
  the share of it the processes above account for.
- ``saturated: …``: the machine, when it was ≥ 85 % busy while no single process used ≥ 85 % of
  a core (the cost is spread over many processes: add CPUs, or cut the per-host CPU above);
  else the process with the highest CPU / wall ratio over the run (100 % = one core busy all
  the time).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

import httpx
import psutil

from benchmarks.launch import KariosUp, sql, tree
from karios.cli.up import parse_service_replicas
from tests.lab import redfish_lab
from tests.lab.redfish_lab import RedfishEmulator, fake_system

VENDORS = ("dell", "hpe", "supermicro", "generic")
STAGES = ("queued", "building_media", "mounting", "booting")
#: A power reset the emulator answered 2xx, and the system it was for.
RESET_LINE = re.compile(r"POST \S*/Systems/([^/\s]+)/Actions/ComputerSystem\.Reset\S* HTTP/[\d.]+\S*\" 2\d\d")
PASSWORD = "storm-bmc-pw"
# InsertMedia reads the head of the medium (like a BMC starting to boot from it), stores nothing.
_HEAD_MEDIA = """\
import os, requests
from urllib.parse import urlparse
from sushy_tools import error
from sushy_tools.emulator.resources import vmedia

def _head_of_image(self, image_url, auth, verify_media_cert, custom_cert):
    with requests.get(image_url, stream=True, auth=auth, verify=False,
                      headers={"Range": "bytes=0-65535"}, timeout=60) as rsp:
        if rsp.status_code >= 400:
            raise error.FishyError("Cannot download virtual media: got error %s from the server"
                                   % rsp.status_code, code=502 if rsp.status_code >= 500 else 400)
        got = sum(len(c) for c in rsp.iter_content(65536))
        if not got:
            raise error.FishyError("empty virtual media", code=400)
    return os.path.basename(urlparse(image_url).path) or "image.iso", ""

vmedia.BaseDriver._get_image = _head_of_image
"""


def bmc_ip(i: int) -> str:
    # 16 /24s per 4,064 hosts (bmc_per_subnet (4) x 16 is not the bound); the first 4,064 as before
    block, k = divmod(i, 16 * 254)
    return f"10.200.{16 * block + k % 16}.{k // 16 + 1}"


def start_emulators(hosts: int, count: int, media: str) -> list[RedfishEmulator]:
    if media == "head":
        redfish_lab._RUN = _HEAD_MEDIA + redfish_lab._RUN  # this process only
    emus = []
    for k in range(count):
        systems = [fake_system(f"s{i:05d}", uuid=f"s{i:05d}") for i in range(k, hosts, count)]
        emus.append(RedfishEmulator(systems, password=PASSWORD, startup_timeout=120).start())
    return emus


class System(KariosUp):
    """``karios up`` with the storm's inventory, BMC endpoints and admission limits."""

    def __init__(self, a: argparse.Namespace, emus: list[RedfishEmulator]) -> None:
        self.prefix = f"storm{uuid.uuid4().hex[:6]}"
        up_args = ["--cluster", str(a.cluster)] if a.cluster else []
        up_args += ["--replicas", str(a.replicas)] if a.replicas else []
        for value in a.service_replicas:
            up_args += ["--service-replicas", value]
        devices = [
            {
                "id": i + 1,
                "name": f"storm-{i:05d}",
                "oob_ip": bmc_ip(i),
                "disks": [{"name": "sda", "size_gb": 100}],
            }
            for i in range(a.hosts)
        ]
        endpoints = {
            bmc_ip(i): {"url": emus[i % len(emus)].url, "system_id": f"s{i:05d}"} for i in range(a.hosts)
        }
        self.limits = {
            "ADMISSION_OVERALL": str(a.overall),
            "ADMISSION_PER_VENDOR": str(a.per_vendor),
            "BMC_CONCURRENCY": str(a.bmc_concurrency),
            "BMC_PER_SUBNET": "4",
            "BUILD_CONCURRENCY": "2",
        }
        self.endpoints_file = self._endpoints_file(endpoints)
        env = {f"KARIOS_PROVISIONER_{k}": v for k, v in self.limits.items()}
        if not a.cluster:  # the shared NATS; with --cluster, karios up's own cluster
            env["KARIOS_NATS_URL"] = os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
        env |= {
            "KARIOS_BUS_PREFIX": self.prefix,
            # A file: 10,000 endpoints are ~700 KB, over what one environment variable holds.
            "KARIOS_PROVISIONER_BMC_ENDPOINTS_FILE": str(self.endpoints_file),
            "KARIOS_PROVISIONER_BMC_TIMEOUT": "60",
            # BMC credentials: the documented name, and the one ProvisionerConfig reads today (its
            # validation_alias drops the env prefix: KARIOS_PROVISIONER_BMC_USER is ignored)
            "KARIOS_PROVISIONER_BMC_USER": "admin",
            "KARIOS_PROVISIONER_BMC_PASSWORD": PASSWORD,
            "BMC_USER": "admin",
            "BMC_PASSWORD": PASSWORD,
            "KARIOS_PROVISIONER_INSTALL_METHOD": "preseed",
            "KARIOS_PROVISIONER_STAGE_DEADLINE": "3600",
        }
        super().__init__("storm", {"devices": devices}, env, up_args=up_args)

    @staticmethod
    def _endpoints_file(endpoints: dict[str, dict[str, str]]) -> Path:
        fd, name = tempfile.mkstemp(prefix="karios-storm-bmcs-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(endpoints, fh, separators=(",", ":"))
        return Path(name)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


async def post_batch(
    s: System, hosts: int, parent: str, accepted: dict[str, float], per_gateway: dict[str, int]
) -> list[str]:
    """The batch, host i to gateway replica i mod R; ``accepted``: job id → when its 202 came
    (epoch seconds); ``per_gateway``: gateway URL → 202s it answered."""
    sem = asyncio.Semaphore(32)
    headers = {"Authorization": f"Bearer {s.token}"}

    async def one(c: httpx.AsyncClient, i: int) -> str:
        body = {
            "bmc_IP": bmc_ip(i),
            "vendor": VENDORS[i % len(VENDORS)],
            "hostname": f"storm-{i:05d}",
            "selected_disks": ["sda"],
            "parent_id": parent,
        }
        async with sem:
            for _ in range(5):
                r = await c.post("/controlnode/provision", json=body, headers=headers)
                if r.status_code != 503:
                    break
                await asyncio.sleep(1)
        if r.status_code != 202:
            raise SystemExit(f"POST for {bmc_ip(i)} to {c.base_url}: {r.status_code} {r.text[:300]}")
        job = str(r.json()["job_id"])
        accepted[job] = time.time()
        per_gateway[str(c.base_url).rstrip("/")] += 1
        return job

    urls = s.gateway_urls()
    for url in urls:
        per_gateway.setdefault(url, 0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=u, timeout=120)) for u in urls]
        return await asyncio.gather(*[one(clients[i % len(clients)], i) for i in range(hosts)])


async def watch(s: System, hosts: int, timeout: float, peak: dict[str, float], usage: Usage) -> dict:
    """Until every job passed booting (or failed), the queue's peak admissions (CPU and memory:
    :class:`Usage`). One database connection for the whole watch, its backend counted as the
    benchmark's own (a connection per poll forked a backend a second: at 3,000 hosts 1,584
    backends, counted as Karios's PostgreSQL)."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    headers = {"Authorization": f"Bearer {s.token}"}
    deadline = time.monotonic() + timeout
    last: dict = {}
    engine = create_async_engine(s.db_url, isolation_level="AUTOCOMMIT")
    async with httpx.AsyncClient(base_url=s.url(), timeout=60) as c, engine.connect() as db:
        usage.harness_backends.add(int((await db.execute(text("SELECT pg_backend_pid()"))).scalar_one()))
        tick = 0
        while time.monotonic() < deadline:
            tick += 1  # the queue (1,000 entries) every 5 s: a UI's poll, not a load of its own
            q = await c.get("/controlnode/provision/queue", headers=headers) if tick % 5 == 1 else None
            if q is not None and q.status_code == 200:
                last = q.json()
                adm = last["admission"]
                peak["active"] = max(peak["active"], adm["active"])
                for v, n in adm["active_by_vendor"].items():
                    peak[f"vendor:{v}"] = max(peak.get(f"vendor:{v}", 0), n)
            rows = await db.execute(
                text(
                    "SELECT count(*) FILTER (WHERE reset_at IS NOT NULL), count(*) FILTER "
                    "(WHERE state IN ('failed','cancelled')) FROM provision.jobs"
                )
            )
            reset, ended = rows.one()
            if reset + ended >= hosts:
                await engine.dispose()
                return last
            await asyncio.sleep(1.0)
    await engine.dispose()
    raise SystemExit(f"timed out after {timeout:.0f}s: {reset} reset, {ended} failed")


async def stage_times(s: System) -> dict[str, dict[str, float]]:
    """job id → state → JetStream timestamp (epoch seconds) of its first event in that state."""
    import nats

    from karios.common.bus.subjects import Subjects

    sub = Subjects(s.prefix)
    nc = await nats.connect(**s.nats_options())
    out: dict[str, dict[str, float]] = {}

    async def read(subject: str, record) -> None:  # type: ignore[no-untyped-def]
        psub = await js.subscribe(subject, ordered_consumer=True)
        while True:
            try:
                msg = await psub.next_msg(timeout=5)
            except nats.errors.TimeoutError:
                break
            record(msg)
            if msg.metadata.num_pending == 0:
                break
        await psub.unsubscribe()

    def event(msg) -> None:  # type: ignore[no-untyped-def]
        parts = msg.subject.split(".")
        job, state = parts[-1], parts[-2]
        if state in STAGES:
            out.setdefault(job, {}).setdefault(state, msg.metadata.timestamp.timestamp())

    try:
        js = nc.jetstream()
        info = await js.stream_info(sub.evt_stream)
        await read(sub.events_of("provision"), event)
        out["_stream"] = {"bytes": float(info.state.bytes), "messages": float(info.state.messages)}
    finally:
        await nc.close()
    return out


class CommandTap:
    """When each start command was published (the gateway's outbox relay): a core NATS subscriber
    on the command subject sees every publish (the work-queue stream keeps nothing once acked)."""

    def __init__(self, s: System) -> None:
        from karios.common.bus.subjects import Subjects

        self.subject = Subjects(s.prefix).cmd("provision", "start")
        self.options = s.nats_options()
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self):  # type: ignore[no-untyped-def]
        import nats

        nc = await nats.connect(**self.options)

        async def on(msg) -> None:  # type: ignore[no-untyped-def]
            self.seen.setdefault((msg.headers or {}).get("Nats-Msg-Id", ""), time.time())

        await nc.subscribe(self.subject, cb=on)
        await nc.flush()
        return nc

    def stop(self) -> dict[str, float]:
        asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        return self.seen


#: The groups of :class:`Usage`, in the table's order (the services as ``karios up`` names them).
GROUPS = (
    "api-gateway",
    "provisioner",
    "inventory",
    "bootapi",
    "fabric-worker",
    "nats-server",
    "emulators",
    "postgresql",
    "karios up",
    "benchmark client",
)


def _cpu(procs: list[psutil.Process], reaped: bool = True) -> float:
    """CPU seconds (user + system and, with ``reaped``, what they reaped of their children:
    a service's short-lived tools) of ``procs``."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + ((t.children_user + t.children_system) if reaped else 0.0)
    return total


def _rss(procs: list[psutil.Process], private: bool = False) -> int:
    """Their RSS summed; ``private``: their USS instead (PostgreSQL's backends: an RSS counts
    every page of the shared buffers the backend touched, once per backend)."""
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_full_info().uss if private else p.memory_info().rss
    return total


@dataclass
class Tracked:
    """One process (with its descendants) as sampled: when first and last seen, its CPU then."""

    group: str
    label: str
    t_first: float
    cpu_first: float
    t_last: float = 0.0
    cpu_last: float = 0.0
    window: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)
    #: The highest CPU / wall over 5 s (None: seen for less than 5 s).
    best_window: float | None = None

    @property
    def cpu(self) -> float:
        return self.cpu_last - self.cpu_first

    @property
    def ratio(self) -> float:
        """CPU seconds / wall seconds while it was seen (1.0: one core busy all along)."""
        return self.cpu / max(1.0, self.t_last - self.t_first)


class Usage:
    """CPU and RSS of every process of the run by group (:data:`GROUPS`), sampled every second
    in a thread between :meth:`start` and :meth:`stop`; the processes found again at every
    sample (a replica the supervisor restarted is a new one)."""

    WINDOW = 5.0

    def __init__(self, s: System, emus: list[RedfishEmulator], interval: float = 1.0) -> None:
        self.s, self.emus, self.interval = s, emus, interval
        self.tracked: dict[tuple[int, float], Tracked] = {}
        self.rss_start: dict[str, int] = {}
        self.rss_peak: dict[str, int] = {}
        self.pg_local = False
        #: PostgreSQL backends of this benchmark's own connections (counted as the client's).
        self.harness_backends: set[int] = set()
        self._labels: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Usage:
        self.t0 = time.monotonic()
        self._cpu0 = psutil.cpu_times()
        self.sample()  # the start values: before the first POST
        self._thread.start()
        return self

    def stop(self) -> Usage:
        self._stop.set()
        self._thread.join(30)
        self.sample()
        self.wall = time.monotonic() - self.t0
        t0, t1 = self._cpu0, psutil.cpu_times()
        idle = (t1.idle + getattr(t1, "iowait", 0.0)) - (t0.idle + getattr(t0, "iowait", 0.0))
        total = sum(t1) - sum(t0)
        #: The whole machine's CPU busy share over the run (every process, ours or not).
        self.machine_busy = max(0.0, 1 - idle / total) if total > 0 else 0.0
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def processes(self) -> list[tuple[str, str, tuple[int, float], list[psutil.Process]]]:
        """(group, label, key, the processes counted) of every process of the run now."""
        out = []
        for group, p in self.s.children():
            with contextlib.suppress(psutil.Error):
                key = (p.pid, p.create_time())
                if group == "nats-server":
                    argv = p.cmdline()
                    label = argv[argv.index("-n") + 1] if "-n" in argv else f"nats-server {p.pid}"
                elif group == "other":
                    label = " ".join(p.cmdline()[:3])
                else:
                    label = self._labels.get(key) or self.s.replica_name(p)
                    self._labels[key] = label
                out.append((group, f"{label} (pid {p.pid})", key, tree(p)))
        for i, e in enumerate(self.emus):
            with contextlib.suppress(psutil.Error):
                if e._proc is not None:
                    p = psutil.Process(e._proc.pid)
                    key = (p.pid, p.create_time())
                    out.append(("emulators", f"emulator {i + 1} (pid {p.pid})", key, tree(p)))
        for group, p in (
            ("karios up", psutil.Process(self.s.proc.pid)),
            ("benchmark client", psutil.Process()),
        ):
            with contextlib.suppress(psutil.Error):
                out.append((group, f"{group} (pid {p.pid})", (p.pid, p.create_time()), [p]))
        # PostgreSQL's backends of this run's database (a local server; readable as root or
        # as its user): "postgres: <cluster>: <user> <database> <client> <state>"
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            title = " ".join(argv)
            if title.startswith("postgres:") and f" {self.s.db} " in f"{title} ":
                self.pg_local = True
                ours = p.pid in self.harness_backends
                group = "benchmark client" if ours else "postgresql"
                with contextlib.suppress(psutil.Error):
                    out.append(
                        (
                            group,
                            f"{'its ' if ours else ''}backend (pid {p.pid})",
                            (p.pid, p.create_time()),
                            [p],
                        )
                    )
        return out

    def sample(self) -> None:
        now = time.monotonic()
        rss: dict[str, int] = dict.fromkeys(GROUPS, 0)
        for group, label, key, procs in self.processes():
            # karios up reaps its services (a restarted one): counted as those processes already
            cpu = _cpu(procs, reaped=group not in ("karios up", "benchmark client"))
            backend = group == "postgresql" or label.startswith("its backend")
            rss[group] = rss.get(group, 0) + _rss(procs, private=backend)
            t = self.tracked.get(key)
            if t is None:
                t = self.tracked[key] = Tracked(group, label, now, cpu)
            t.t_last, t.cpu_last = now, max(cpu, t.cpu_last)
            t.window.append((now, cpu))
            while len(t.window) > 1 and now - t.window[1][0] >= self.WINDOW:
                t.window.popleft()
            t0, c0 = t.window[0]
            if now - t0 >= self.WINDOW * 0.9:
                t.best_window = max(t.best_window or 0.0, (cpu - c0) / (now - t0))
        for group, value in rss.items():
            self.rss_start.setdefault(group, value)
            self.rss_peak[group] = max(self.rss_peak.get(group, 0), value)

    def groups(self) -> dict[str, list[Tracked]]:
        out: dict[str, list[Tracked]] = {}
        for t in self.tracked.values():
            out.setdefault(t.group, []).append(t)
        return out

    def cpu_of(self, group: str) -> float:
        return sum(t.cpu for t in self.groups().get(group, []))

    def busiest(self) -> Tracked | None:
        return max(self.tracked.values(), key=lambda t: t.ratio, default=None)

    def label_of_pid(self, pid: int) -> str:
        for (p, _), t in self.tracked.items():
            if p == pid:
                return t.label.split(" (pid")[0]
        return f"pid {pid} (gone)"


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--emulators", type=int, default=4)
    ap.add_argument("--overall", type=int, default=64)
    ap.add_argument("--per-vendor", type=int, default=32)
    ap.add_argument("--bmc-concurrency", type=int, default=64, help="per-replica BMC operations at once")
    ap.add_argument("--media", choices=("head", "full"), default="head")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--keep", action="store_true", help="keep the state dir (logs) after the run")
    ap.add_argument(
        "--cluster",
        type=int,
        default=0,
        help="karios up --cluster N: its own N-node NATS cluster (default 0: the shared NATS)",
    )
    ap.add_argument(
        "--replicas", type=int, default=0, help="karios up --replicas: processes of every service"
    )
    ap.add_argument(
        "--service-replicas",
        action="append",
        default=[],
        metavar="SERVICE=N",
        help="karios up --service-replicas (repeatable): N processes of SERVICE",
    )
    a = ap.parse_args()
    try:
        parse_service_replicas(a.service_replicas)
    except ValueError as exc:
        ap.error(f"--service-replicas: {exc}")

    t = time.monotonic()
    emus = start_emulators(a.hosts, a.emulators, a.media)
    print(f"{a.emulators} sushy-tools emulators with {a.hosts} systems up in {time.monotonic() - t:.1f}s")
    s = None
    try:
        t = time.monotonic()
        s = System(a, emus)
        print(
            f"karios up ready in {time.monotonic() - t:.1f}s; {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        state = s.state
        logs0 = [len(e.log()) for e in emus]
        disk0 = du(state)
        cache = state / "provisioner" / "cache"
        cache0 = du(cache) if cache.exists() else 0
        db0 = asyncio.run(sql(s.db_url, "SELECT pg_database_size(current_database())"))[0][0]
        tables0 = asyncio.run(table_sizes(s.db_url))
        peak = {"active": 0.0}
        parent = str(uuid.uuid4())
        accepted: dict[str, float] = {}
        per_gateway: dict[str, int] = {}
        tap = CommandTap(s)
        usage = Usage(s, emus).start()
        t0 = time.time()
        jobs = asyncio.run(post_batch(s, a.hosts, parent, accepted, per_gateway))
        posted = time.time() - t0
        last = asyncio.run(watch(s, a.hosts, a.timeout, peak, usage))
        wall = time.time() - t0
        usage.stop()
        rows = asyncio.run(
            sql(
                s.db_url,
                "SELECT id, state, extract(epoch FROM reset_at), message, owner FROM provision.jobs",
            )
        )
        cpu = {g: usage.cpu_of(g) for g in ("provisioner", "api-gateway", "emulators")}
        disk1 = du(state)
        base = du(cache) - cache0  # the base ISO(s): once per configuration, not per host
        db1 = asyncio.run(sql(s.db_url, "SELECT pg_database_size(current_database())"))[0][0]
        tables1 = asyncio.run(table_sizes(s.db_url))
        times = asyncio.run(stage_times(s))
        for job, at in accepted.items():
            times.setdefault(job, {})["accepted"] = at
        for job, at in tap.stop().items():
            times.setdefault(job, {})["command"] = at
        peak.update({f"cpu:{k}": v for k, v in cpu.items()})
        peak["rss"] = float(usage.rss_peak.get("provisioner", 0))
        rss0 = float(usage.rss_start.get("provisioner", 0))
        names = {url: name for name, url in s.replica_urls().items()}
        replicas = {
            "gateway": {names.get(url, url): n for url, n in per_gateway.items()},
            "provisioner": len(usage.groups().get("provisioner", [])),
        }
        ok = report(
            a,
            emus,
            logs0,
            jobs,
            rows,
            times,
            t0,
            posted,
            wall,
            peak,
            rss0,
            (disk1 - disk0, base),
            db1 - db0,
            last,
            replicas,
        )
        report_usage(a, s, usage, rows, db1 - db0)
        report_tables(a.hosts, tables0, tables1, db1 - db0)
        if not ok:
            sys.exit(1)
    finally:
        if s is not None:
            s.stop(a.keep)
            s.endpoints_file.unlink(missing_ok=True)
        for e in emus:
            e.stop()


def report(a, emus, logs0, jobs, rows, times, t0, posted, wall, peak, rss0, disk, db, last, replicas) -> bool:  # type: ignore[no-untyped-def]
    """The run's tables; whether every job reset and every system was reset exactly once."""
    resets = [float(r[2]) for r in rows if r[2] is not None]
    failed = [r for r in rows if r[1] in ("failed", "cancelled")]
    requests, reset_posts = 0, 0
    per_system: collections.Counter[str] = collections.Counter()
    for e, since in zip(emus, logs0, strict=True):
        lines = e.requests_seen(since)
        requests += len(lines)
        for line in lines:
            if m := RESET_LINE.search(line):
                reset_posts += 1
                per_system[m.group(1)] += 1
    once = sum(1 for i in range(a.hosts) if per_system.get(f"s{i:05d}") == 1)
    twice = sum(1 for n in per_system.values() if n > 1)
    stream = times.pop("_stream", {})
    spans = {
        "202 → command in JetStream (gateway's outbox relay)": ("accepted", "command"),
        "command → queued (provisioner intake: job row + event)": ("command", "queued"),
        "queued → building_media (admission wait + BMC probe)": ("queued", "building_media"),
        "building_media → mounting (medium)": ("building_media", "mounting"),
        "mounting → booting (insert, boot override)": ("mounting", "booting"),
        "queued → booting": ("queued", "booting"),
    }
    print(f"\nBoot storm: {a.hosts} hosts, {a.emulators} sushy-tools processes, media={a.media}")
    print(
        f"admission: overall {a.overall}, per vendor {a.per_vendor}; per replica: bmc_concurrency "
        f"{a.bmc_concurrency}, bmc_per_subnet 4, build_concurrency 2; vendors {', '.join(VENDORS)}"
    )
    print(
        f"peak admitted: {int(peak['active'])} overall, "
        + ", ".join(f"{k} {int(v)}" for k, v in sorted(peak.items()) if k.startswith("vendor:"))
    )
    print("\n| metric | value |\n| --- | --- |")
    print(f"| POSTs accepted (202), 32 at a time | {len(jobs)} in {posted:.1f} s |")
    last_reset = max(resets) - t0 if resets else float("nan")
    print(f"| time to the last reset (first POST → last reset_at) | {last_reset:.1f} s |")
    print(f"| jobs reset / failed | {len(resets)} / {len(failed)} |")
    print(f"| resets seen by the emulators (2xx) | {reset_posts} |")
    print(f"| BMC requests per host (emulator logs) | {requests / max(1, a.hosts):.1f} |")
    summed = f" ({replicas['provisioner']} processes summed)" if replicas["provisioner"] > 1 else ""
    print(f"| provisioner RSS start → peak{summed} | {rss0 / 2**20:.0f} → {peak['rss'] / 2**20:.0f} MiB |")
    print(f"| state dir growth (of it: base ISO) | {disk[0] / 2**20:.2f} MiB ({disk[1] / 2**20:.2f}) |")
    per_host = (disk[0] - disk[1]) / max(1, a.hosts) / 1024
    print(f"| state dir growth per host, base ISO excluded | {per_host:.1f} KiB |")
    print(f"| database growth | {db / 2**20:.2f} MiB |")
    print(f"| database growth per host | {db / max(1, a.hosts) / 1024:.1f} KiB |")
    where = f"the run's {a.cluster}-node NATS cluster, per copy" if a.cluster else "shared NATS"
    print(
        f"| event stream ({where}) | {stream.get('messages', 0):.0f} msgs, "
        f"{stream.get('bytes', 0) / 2**20:.2f} MiB |"
    )
    print(f"| wall time of the run | {wall:.1f} s |")
    intake = [t["queued"] - t0 for t in times.values() if "queued" in t]
    relayed = [t["command"] - t0 for t in times.values() if "command" in t]
    print(f"| last start command in JetStream (gateway's outbox relay) | {max(relayed, default=0):.1f} s |")
    print(f"| last job recorded by the provisioner (its queued event) | {max(intake, default=0):.1f} s |")
    cpu = ", ".join(f"{k[4:]} {v:.0f} s" for k, v in peak.items() if k.startswith("cpu:"))
    print(f"| CPU seconds during the run | {cpu} |")
    per_host = peak.get("cpu:provisioner", 0) / max(1, a.hosts) * 1000
    print(f"| provisioner CPU per host | {per_host:.0f} ms |")
    print(f"| systems reset exactly once (emulator logs) | {once} of {a.hosts}; {twice} more than once |")
    gw = replicas["gateway"]
    print(f"| POSTs (202) per gateway replica | {', '.join(f'{name} {n}' for name, n in gw.items())} |")
    print("\n| stage | p50 s | p90 s | p99 s | max s |\n| --- | --- | --- | --- | --- |")
    for name, (a_, b_) in spans.items():
        d = [t[b_] - t[a_] for t in times.values() if a_ in t and b_ in t]
        top = max(d, default=float("nan"))
        print(f"| {name} | {pct(d, 50):.2f} | {pct(d, 90):.2f} | {pct(d, 99):.2f} | {top:.2f} |")
    if failed:
        print("\nfailures (first 5):")
        for r in failed[:5]:
            print(f"  {r[0]}: {r[3][:200]}")
    print(f"\nqueue at the end: queued {last.get('queued')}, active {last.get('active')}")
    return len(resets) == a.hosts and reset_posts == a.hosts and once == a.hosts


def report_usage(a: argparse.Namespace, s: System, usage: Usage, rows: list[Any], db: int) -> None:
    """Where the CPU and memory went, per group of processes (:class:`Usage`)."""
    hosts = max(1, a.hosts)
    owners = collections.Counter(usage.label_of_pid(_owner_pid(r[4])) for r in rows if r[4])
    print(
        "\njobs per provisioner replica (lease owner at the end): "
        + (", ".join(f"{k} {n}" for k, n in sorted(owners.items())) or "none")
    )
    print(
        f"\nCPU and memory during the run ({usage.wall:.1f} s of wall time, sampled every "
        f"{usage.interval:.0f} s; {a.hosts} hosts; {os.cpu_count()} CPUs)"
    )
    print(
        "\n| processes of | n | CPU s | CPU ms per host | busiest process: CPU / wall (its busiest 5 s) "
        "| RSS start → peak, summed | RSS growth per host |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    groups = usage.groups()
    total = 0.0
    for group in GROUPS:
        members = groups.get(group, [])
        if not members:
            if group == "postgresql" and not usage.pg_local:
                print("| postgresql | — | not on this machine (or not readable) | | | | |")
            continue
        cpu = sum(t.cpu for t in members)
        total += cpu
        top = max(members, key=lambda t: t.ratio)
        start, peak = usage.rss_start.get(group, 0), usage.rss_peak.get(group, 0)
        print(
            f"| {group} | {len(members)} | {cpu:.1f} | {cpu / hosts * 1000:.1f} | "
            f"{top.label.split(' (pid')[0]}: {top.ratio * 100:.0f} % ({_pct(top.best_window)}) | "
            f"{start / 2**20:.0f} → {peak / 2**20:.0f} MiB | {(peak - start) / hosts / 1024:.1f} KiB |"
        )
    print(f"| all of them | {len(usage.tracked)} | {total:.1f} | {total / hosts * 1000:.1f} | | | |")
    print(f"\ndatabase growth per host: {db / hosts / 1024:.1f} KiB ({db / 2**20:.2f} MiB in all)")
    ncpu = os.cpu_count() or 1
    print(
        f"machine: {usage.machine_busy * 100:.0f} % of {ncpu} CPUs busy over the run "
        f"({total / usage.wall / ncpu * 100:.0f} % by the processes above)"
    )
    if (top := usage.busiest()) is not None:
        what = (
            f"the machine ({ncpu} CPUs {usage.machine_busy * 100:.0f} % busy; no one process is: "
            f"the busiest, {top.label}, used {top.ratio * 100:.0f} % of a core)"
            if usage.machine_busy >= 0.85 and top.ratio < 0.85
            else f"{top.label} at {top.ratio * 100:.0f} % of a core (CPU s / wall s over the run; "
            f"{_pct(top.best_window)} in its busiest 5 s)"
        )
        print(f"saturated: {what}")
    if usage.pg_local:
        print(
            "(postgresql: its backends of this database, CPU from when each was first seen; "
            "memory: their USS, not RSS, which counts the shared buffers once per backend)"
        )


#: Per table: its size with indexes and TOAST, its heap alone, live and dead rows (PostgreSQL's
#: statistics, which lag a transaction by up to a second).
TABLES_SQL = """
SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%'
"""


async def table_sizes(db_url: str) -> dict[str, tuple[int, int, int, int]]:
    return {r[0]: (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in await sql(db_url, TABLES_SQL)}


def report_tables(
    hosts: int,
    before: dict[str, tuple[int, int, int, int]],
    after: dict[str, tuple[int, int, int, int]],
    db: int,
    top: int = 10,
) -> None:
    """Where the database growth went: the tables that grew most, with their dead rows (an update
    leaves the old row version behind until (auto)vacuum; indexes grow with every version)."""
    grew = sorted(
        (
            (name, size - before.get(name, (0, 0, 0, 0))[0], heap, live, dead)
            for name, (size, heap, live, dead) in after.items()
        ),
        key=lambda r: -r[1],
    )
    print(
        f"\ndatabase growth by table (the {top} that grew most of {len(after)}; all: {db / 2**20:.2f} MiB)\n"
    )
    print("| table | growth | KiB per host | heap / indexes + TOAST at the end | live rows | dead rows |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for name, growth, heap, live, dead in grew[:top]:
        size = after[name][0]
        print(
            f"| {name} | {growth / 2**20:.2f} MiB | {growth / max(1, hosts) / 1024:.1f} | "
            f"{heap / 2**20:.2f} / {(size - heap) / 2**20:.2f} MiB | {live} | {dead} |"
        )


def _pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.0f} %"


def _owner_pid(owner: str) -> int:
    """The pid in a job's lease owner ``<hostname>-<pid>-<8 hex>`` (0 if none)."""
    parts = owner.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


if __name__ == "__main__":
    main()
