"""1,000 hosts at once (issue 14, item 4): one provisioning batch through the gateway onto
emulated BMCs, with admission control.

    nice -n 10 uv run python benchmarks/provision_storm.py [--hosts 1000] [--emulators 4]
        [--overall 64] [--per-vendor 32] [--media head|full]

``karios up`` (the shared NATS at ``KARIOS_NATS_URL`` under a prefix of its own, a fresh database
on ``KARIOS_BENCH_PG``, dropped at the end) with a file inventory of N devices; N fake systems
spread over ``--emulators`` sushy-tools processes (tests/lab/redfish_lab.py, instant power).
The batch is N ``POST /controlnode/provision`` sharing one ``parent_id`` (there is no batch
endpoint), 32 at a time, vendors round robin (dell, hpe, supermicro, generic).

``--media head`` (default): the emulator's InsertMedia fetches the first 64 KiB of the medium
(status and length checked) instead of downloading it whole — stock sushy-tools copies every
54.5 MB ISO into its temp dir and keeps it until eject, i.e. 54 GB for 1,000 booting hosts; a real
BMC reads the medium on demand. ``--media full`` keeps the stock behaviour (use a small N).

Prints: time from the first POST to the last power reset (the job rows' ``reset_at``, and every
emulator saw exactly one reset per system), per-stage percentiles from the JetStream timestamps
of the job events (and, before them, when each 202 came and when the gateway's outbox relay
published the start command, seen by a core NATS subscriber), BMC requests per host (the
emulators' request logs), the provisioner's peak RSS, state-dir / database / event-stream
growth, and the admission limits used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*

import httpx
import psutil

from benchmarks.launch import KariosUp, sql
from tests.lab import redfish_lab
from tests.lab.redfish_lab import RedfishEmulator, fake_system

VENDORS = ("dell", "hpe", "supermicro", "generic")
STAGES = ("queued", "building_media", "mounting", "booting")
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
    return f"10.200.{i % 16}.{i // 16 + 1}"  # 16 /24s: bmc_per_subnet (4) x 16 is not the bound


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
        self.nats = os.environ.get("KARIOS_NATS_URL", "nats://127.0.0.1:4222")
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
        env = {f"KARIOS_PROVISIONER_{k}": v for k, v in self.limits.items()}
        env |= {
            "KARIOS_NATS_URL": self.nats,
            "KARIOS_BUS_PREFIX": self.prefix,
            "KARIOS_PROVISIONER_BMC_ENDPOINTS": json.dumps(endpoints, separators=(",", ":")),
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
        super().__init__("storm", {"devices": devices}, env)

    def provisioner(self) -> psutil.Process:
        return self.process_of("provisioner")


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


async def post_batch(s: System, hosts: int, parent: str, accepted: dict[str, float]) -> list[str]:
    """The batch; ``accepted``: job id → when its 202 came (epoch seconds)."""
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
            raise SystemExit(f"POST for {bmc_ip(i)}: {r.status_code} {r.text[:300]}")
        job = str(r.json()["job_id"])
        accepted[job] = time.time()
        return job

    async with httpx.AsyncClient(base_url=s.url(), timeout=120) as c:
        return await asyncio.gather(*[one(c, i) for i in range(hosts)])


async def watch(s: System, hosts: int, timeout: float, peak: dict[str, float]) -> dict:
    """Until every job passed booting (or failed): sample the provisioner's RSS and the queue."""
    proc = s.provisioner()
    headers = {"Authorization": f"Bearer {s.token}"}
    deadline = time.monotonic() + timeout
    last: dict = {}
    async with httpx.AsyncClient(base_url=s.url(), timeout=60) as c:
        tick = 0
        while time.monotonic() < deadline:
            peak["rss"] = max(peak["rss"], proc.memory_info().rss)
            tick += 1  # the queue (1,000 entries) every 5 s: a UI's poll, not a load of its own
            q = await c.get("/controlnode/provision/queue", headers=headers) if tick % 5 == 1 else None
            if q is not None and q.status_code == 200:
                last = q.json()
                adm = last["admission"]
                peak["active"] = max(peak["active"], adm["active"])
                for v, n in adm["active_by_vendor"].items():
                    peak[f"vendor:{v}"] = max(peak.get(f"vendor:{v}", 0), n)
            rows = await sql(
                s.db_url,
                "SELECT count(*) FILTER (WHERE reset_at IS NOT NULL), count(*) FILTER "
                "(WHERE state IN ('failed','cancelled')) FROM provision.jobs",
            )
            reset, ended = rows[0]
            if reset + ended >= hosts:
                return last
            await asyncio.sleep(1.0)
    raise SystemExit(f"timed out after {timeout:.0f}s: {reset} reset, {ended} failed")


async def stage_times(s: System) -> dict[str, dict[str, float]]:
    """job id → state → JetStream timestamp (epoch seconds) of its first event in that state."""
    import nats

    from karios.common.bus.subjects import Subjects

    sub = Subjects(s.prefix)
    nc = await nats.connect(s.nats)
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
        self.url = s.nats
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self):  # type: ignore[no-untyped-def]
        import nats

        nc = await nats.connect(self.url)

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


def cpu_seconds(s: System, emus: list[RedfishEmulator]) -> dict[str, float]:
    """CPU seconds (user + system) so far of the provisioner, the gateway and the emulators."""

    def of(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    kids = {" ".join(c.cmdline()[-2:]): c for c in psutil.Process(s.proc.pid).children(recursive=True)}
    return {
        "provisioner": of(kids["run provisioner"]),
        "api-gateway": of(kids["run api-gateway"]),
        "emulators": sum(of(psutil.Process(e._proc.pid)) for e in emus if e._proc is not None),
    }


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
    a = ap.parse_args()

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
        state = s.root / "state"
        logs0 = [len(e.log()) for e in emus]
        disk0 = du(state)
        cache = state / "provisioner" / "cache"
        cache0 = du(cache) if cache.exists() else 0
        db0 = asyncio.run(sql(s.db_url, "SELECT pg_database_size(current_database())"))[0][0]
        peak = {"rss": float(s.provisioner().memory_info().rss), "active": 0.0}
        rss0 = peak["rss"]
        cpu0 = cpu_seconds(s, emus)
        t0 = time.time()
        parent = str(uuid.uuid4())
        accepted: dict[str, float] = {}
        tap = CommandTap(s)
        jobs = asyncio.run(post_batch(s, a.hosts, parent, accepted))
        posted = time.time() - t0
        last = asyncio.run(watch(s, a.hosts, a.timeout, peak))
        wall = time.time() - t0
        rows = asyncio.run(
            sql(s.db_url, "SELECT id, state, extract(epoch FROM reset_at), message FROM provision.jobs")
        )
        cpu = {k: v - cpu0[k] for k, v in cpu_seconds(s, emus).items()}
        disk1 = du(state)
        base = du(cache) - cache0  # the base ISO(s): once per configuration, not per host
        db1 = asyncio.run(sql(s.db_url, "SELECT pg_database_size(current_database())"))[0][0]
        times = asyncio.run(stage_times(s))
        for job, at in accepted.items():
            times.setdefault(job, {})["accepted"] = at
        for job, at in tap.stop().items():
            times.setdefault(job, {})["command"] = at
        peak.update({f"cpu:{k}": v for k, v in cpu.items()})
        report(
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
        )
    finally:
        if s is not None:
            s.stop(a.keep)
        for e in emus:
            e.stop()


def report(a, emus, logs0, jobs, rows, times, t0, posted, wall, peak, rss0, disk, db, last) -> None:  # type: ignore[no-untyped-def]
    resets = [float(r[2]) for r in rows if r[2] is not None]
    failed = [r for r in rows if r[1] in ("failed", "cancelled")]
    requests, reset_posts = 0, 0
    for e, since in zip(emus, logs0, strict=True):
        lines = e.requests_seen(since)
        requests += len(lines)
        reset_posts += sum(
            1 for line in lines if re.search(r"POST \S*ComputerSystem\.Reset\S* HTTP/[\d.]+\S*\" 2\d\d", line)
        )
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
    print(f"| provisioner RSS start → peak | {rss0 / 2**20:.0f} → {peak['rss'] / 2**20:.0f} MiB |")
    print(f"| state dir growth (of it: base ISO) | {disk[0] / 2**20:.2f} MiB ({disk[1] / 2**20:.2f}) |")
    per_host = (disk[0] - disk[1]) / max(1, a.hosts) / 1024
    print(f"| state dir growth per host, base ISO excluded | {per_host:.1f} KiB |")
    print(f"| database growth | {db / 2**20:.2f} MiB |")
    print(
        f"| event stream (shared NATS) | {stream.get('messages', 0):.0f} msgs, "
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
    if len(resets) != a.hosts or reset_posts != a.hosts:
        sys.exit(1)


if __name__ == "__main__":
    main()
