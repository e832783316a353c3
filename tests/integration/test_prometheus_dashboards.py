"""A real Prometheus scrapes the real services while a workload runs; then every panel of every
generated dashboard (deploy/grafana) returns data, and the alert rules pass promtool.

Workload: node registrations, 5 provisions on the sushy-tools Redfish emulator (4 complete, 1
fails at an installer step), boot API requests, a fabric config + plan + apply (the one-node
namespace lab with sshd + FRR converges; the 4 provisioned hosts, registered at first boot with
addresses nothing answers on, fail). Prometheus (Debian's package) runs on a free port with a scrape config
generated from deploy/prometheus/prometheus.yml (same job names, the test's ports) and the
same rule files. Skipped with the reason when prometheus or the labs are missing; failed under CI.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from karios.api_gateway.app import create_app as gateway_app
from karios.bootapi.app import create_app as bootapi_app
from karios.fabric_worker.app import create_app as worker_app
from karios.fabric_worker.settings import FabricWorkerSettings
from karios.inventory.app import create_app as inventory_app
from karios.provisioner.app import create_app as provisioner_app
from karios.provisioner.config import ProvisionerConfig
from tests.fixtures.apps import ADMIN, free_port
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.fabric import finished, forget_jobs
from tests.fixtures.provision import (
    STACK_BMCS,
    medium_token,
    retire_leftover_jobs,
    use_installer_media,
    wait_job,
    write_inventory,
)
from tests.fixtures.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
sys.path.insert(0, str(ROOT / "tests" / "lab"))
import fabric_lab  # noqa: E402
from build import build  # noqa: E402
from panels import DASHBOARDS  # noqa: E402

from tests.lab.redfish_lab import RedfishEmulator, fake_system  # noqa: E402

CI = os.environ.get("CI", "").lower() == "true"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
RULES = ROOT / "deploy" / "prometheus" / "rules"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests"
pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.fabric_lab]


def _need(reason: str | None) -> None:
    if reason:
        if CI:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def _need_prometheus() -> None:
    _need(None if PROMETHEUS and PROMTOOL else "prometheus/promtool not installed (tests/lab/setup.sh)")


def test_shipped_prometheus_config_is_valid_and_scrapes_every_replica() -> None:
    _need_prometheus()
    shipped = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    check = subprocess.run(
        [PROMTOOL, "check", "config", "--syntax-only", str(shipped)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    jobs = {j["job_name"]: j for j in yaml.safe_load(shipped.read_text())["scrape_configs"]}
    for service in ("api-gateway", "bootapi", "provisioner", "inventory", "fabric-worker"):
        # one DNS name, one A record per compose replica: every replica is scraped
        assert jobs[f"karios-{service}"]["dns_sd_configs"][0]["names"] == [service]


def test_alert_rules_pass_promtool() -> None:
    _need_prometheus()
    rules = sorted(str(p) for p in RULES.glob("*.yml"))
    tests = sorted(str(p) for p in RULE_TESTS.glob("*.yml"))
    assert rules and tests
    check = subprocess.run([PROMTOOL, "check", "rules", *rules], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([PROMTOOL, "test", "rules", *tests], capture_output=True, text=True, cwd=RULE_TESTS)
    assert run.returncode == 0, run.stdout + run.stderr


def scrape_config(targets: dict[str, str], interval: str = "1s") -> dict:
    """deploy/prometheus/prometheus.yml with this test's targets and a short interval."""
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = interval
    cfg["rule_files"] = [str(p) for p in sorted(RULES.glob("*.yml"))]
    cfg.pop("alerting", None)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    for service, url in targets.items():
        job = jobs[f"karios-{service}"]  # every service has its job in the shipped config
        job.pop("dns_sd_configs", None)  # compose finds the replicas by DNS; here: this test's ports
        job["static_configs"] = [{"targets": [url.removeprefix("http://")]}]
    cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if j["job_name"].startswith("karios-")]
    return cfg


class Prometheus:
    def __init__(self, config: dict, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    async def ready(self, c: httpx.AsyncClient) -> None:
        async def up() -> bool:
            assert self.proc.poll() is None, "prometheus exited (see prometheus.log)"
            try:
                return (await c.get(f"{self.url}/-/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(up, timeout=60, what="prometheus ready")

        async def scraped_all() -> bool:  # the workload's first changes must find a baseline sample
            r = await c.get(f"{self.url}/api/v1/query", params={"query": 'count(up{job=~"karios-.*"} == 1)'})
            result = r.json()["data"]["result"]
            return bool(result) and result[0]["value"][1] == "5"

        await wait_until(scraped_all, timeout=60, what="a first scrape of the 5 services")

    async def query_range(self, c: httpx.AsyncClient, expr: str, start: float, end: float) -> list[dict]:
        r = await c.get(
            f"{self.url}/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": "2s"}
        )
        assert r.status_code == 200, f"{expr}: {r.text}"
        return r.json()["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's template variables as the dashboard's "All" would send them."""
    for name in variables:
        expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
    return expr.replace("$__rate_interval", "15s")


def has_value(result: list[dict]) -> bool:
    return any(v[1] not in ("NaN", "+Inf", "-Inf") for s in result for v in s.get("values", []))


@pytest.fixture(scope="module")
def emulator():
    try:
        emu = RedfishEmulator([fake_system(f"node{i}") for i in range(1, 6)], auth=True)
        emu.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        _need(f"sushy-tools emulator unavailable: {exc}")
    yield emu
    emu.stop()


@pytest.fixture
def workdir():
    """Our own directory: concurrent pytest sessions on this machine prune each other's basetemp."""
    with tempfile.TemporaryDirectory(prefix="karios-prom-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def lab():
    _need(fabric_lab.skip_reason())
    with fabric_lab.FabricLab(n_nodes=1, prefix="kp") as lab:
        yield lab


async def provision_workload(c: httpx.AsyncClient, cfg: ProvisionerConfig) -> None:
    """5 provisions through the gateway: 4 run to completed, the 5th fails at an installer step."""
    vendors = ["dell", "hp", "supermicro", "generic", "dell"]
    posts = [
        await c.post(
            "/controlnode/provision",
            json={
                "bmc_IP": ip,
                "vendor": vendor,
                "hostname": f"pm{n}",
                "os_password": "os-s3cret-pw",
                "selected_disks": ["sda"],
                "zone": "z1",
            },
            headers=ADMIN,
        )
        for n, (ip, vendor) in enumerate(zip(STACK_BMCS, vendors, strict=True), 1)
    ]
    assert [p.status_code for p in posts] == [202] * 5, [p.text for p in posts]
    jobs = [p.json()["job_id"] for p in posts]
    await asyncio.gather(*[wait_job(c, j, {"booting"}, timeout=240) for j in jobs])
    for n, (job_id, ip) in enumerate(zip(jobs, STACK_BMCS, strict=True), 1):
        token, _ = medium_token(cfg.media_dir / f"{job_id}.iso")
        h = {"X-Karios-Job-Token": token}
        if n == 5:
            r = await c.post(
                f"/controlnode/job/{job_id}/step",
                json={"step": "partitioning", "state": "failed", "message": "no disk sdz"},
                headers=h,
            )
            assert r.status_code == 200, r.text
            continue
        step = {"step": "partitioning", "state": "active", "percent": 60}
        assert (await c.post(f"/controlnode/job/{job_id}/step", json=step, headers=h)).status_code == 200
        done = {"os_ip": f"10.1.0.{n}"}
        assert (await c.post(f"/controlnode/job/{job_id}/complete", json=done, headers=h)).status_code == 200
        fb = {"bmc_ip": ip, "os_ip": f"10.1.0.{n}"}
        assert (await c.post("/controlnode/firstboot", json=fb, headers=h)).status_code == 200
    await asyncio.gather(*[wait_job(c, j, {"completed"}) for j in jobs[:4]])
    await wait_job(c, jobs[4], {"failed"})


async def fabric_workload(c: httpx.AsyncClient, lab) -> None:  # type: ignore[no-untyped-def]
    """Register the lab's node, plan and store a fabric config, apply it (``c`` sends ADMIN)."""
    node = lab.nodes[0]
    r = await c.post(
        "/controlnode/register",
        json={"bmc_ip": "198.18.1.1", "os_ip": node.underlay_ip, "os_username": "root", "fqdn": node.name},
    )
    assert r.status_code == 200, r.text
    config = {
        "as": 65000,
        "fabric_switch_as": 65000,
        "fabric_switch_name": "rr",
        "fabric_switch_nos": "other",
        "fabric_switch_peering_ip": fabric_lab.FABRIC_IP,
        "fabric_switch_role": "spine",
        "management_cidr": "198.18.0.0/24",
        "router_id_cidr": "198.19.1.1/24",
        "vxlan_mtu": 9000,
        "ospf_enabled": False,
        "expected_nodes": 1,
    }
    r = await c.post("/controlnode/fabric-config/plan", json={**config, "public_mtu": 1500})
    assert r.status_code == 200, r.text
    r = await c.post("/controlnode/fabric-config", json=config)
    assert r.status_code == 201, r.text
    r = await c.post("/controlnode/fabric-config/apply")
    assert r.status_code == 202, r.text
    job = await finished(c, r.json()["apply_job_id"])
    # The 4 provisioned hosts registered their (unreachable) OS IPs at first boot: they fail, the
    # lab node converges — per-node state of both kinds for the fabric dashboard.
    ok = {n["node_ip"]: n["ok"] for n in job["nodes"]}
    assert ok.pop(node.underlay_ip) is True and ok and not any(ok.values()), job


@pytest.mark.timeout(900)  # the one-node lab may wait for another lab's host link
async def test_every_dashboard_panel_has_data(settings, serve, emulator, lab, workdir) -> None:  # type: ignore[no-untyped-def]
    _need_prometheus()
    await retire_leftover_jobs(settings.database_url)
    inventory = write_inventory(workdir / "inventory.yaml", list(STACK_BMCS))
    inv = await serve(inventory_app(settings.model_copy(update={"inventory_file": inventory})))
    cfg = ProvisionerConfig(
        cache_dir=Path(tempfile.gettempdir()) / "karios-test-media-cache",
        media_dir=mkdir(workdir / "media"),
        images_dir=mkdir(workdir / "images"),
        bmc_retries=1,
        bmc_backoff=0.1,
        bmc_timeout=30,
        power_deadline=30,
        build_concurrency=2,
        install_method="preseed",
        stuck_check_interval=0.5,
        bmc_endpoints={
            ip: {
                "url": emulator.url,
                "system_id": sid,
                "username": emulator.username,
                "password": emulator.password,
            }
            for ip, sid in zip(STACK_BMCS, emulator.system_ids, strict=True)
        },
    )
    prov_app = provisioner_app(settings, cfg)
    use_installer_media(prov_app.state.jobs)
    prov = await serve(prov_app)
    rollout = FabricWorkerSettings(
        ssh_key=Path(lab.client_key_path), vnis="100", connect_timeout=5, verify_timeout=60, drift_interval=2
    )
    fab = await serve(worker_app(settings, rollout_settings=rollout))
    await forget_jobs(settings)
    boot = await serve(bootapi_app(settings, boot_settings()))
    gw = await serve(gateway_app(settings))
    cfg.media_url, cfg.callback_url = prov.url, gw.url
    for sid in emulator.system_ids:
        emulator.request(
            "POST", f"/redfish/v1/Systems/{sid}/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia", {}
        )
    targets = {
        "api-gateway": gw.url,
        "inventory": inv.url,
        "provisioner": prov.url,
        "bootapi": boot.url,
        "fabric-worker": fab.url,
    }
    prom = Prometheus(scrape_config(targets), mkdir(workdir / "prometheus"))
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            await prom.ready(c)
            start = time.time()
            t0 = time.perf_counter()
            await provision_workload(c, cfg)
            for mac in ("52:54:00:00:00:01", "52:54:00:00:00:02", "52:54:00:00:00:01"):
                assert (await c.get(f"{boot.url}/ipxe/{mac}")).status_code == 200
            async with httpx.AsyncClient(base_url=gw.url, timeout=60, headers=ADMIN) as admin:
                await fabric_workload(admin, lab)
            print(f"\nworkload: {time.perf_counter() - t0:.1f}s")

            workload_end = time.time()

            async def scraped_after_workload() -> bool:
                result = await prom.query_range(c, "karios_fabric_jobs_total", start, time.time())
                bus = await prom.query_range(c, "karios_bus_dlq_messages", start, time.time())
                # Every target scraped at least twice after the workload (a rate needs two samples
                # that saw it; a fast workload used to end between two scrapes of some target).
                r = await c.get(f"{prom.url}/api/v1/query", params={"query": "min(timestamp(up == 1))"})
                last = r.json()["data"]["result"]
                twice = bool(last) and float(last[0]["value"][1]) >= workload_end + 2.5
                return has_value(result) and has_value(bus) and twice

            await wait_until(scraped_after_workload, timeout=60, what="prometheus to scrape the workload")
            end = time.time()
            empty, checked = [], 0
            for d in DASHBOARDS:
                built = build(d)
                variables = {v["name"]: v["query"] for v in built["templating"].get("list", [])}
                for panel in built["panels"]:
                    for target in panel["targets"]:
                        expr = substitute(target["expr"], variables)
                        checked += 1
                        if not has_value(await prom.query_range(c, expr, start, end)):
                            empty.append(f"{d.title} / {panel['title']}: {expr}")
            print(f"{checked} panel queries checked against Prometheus")
            assert not empty, "panels without data:\n" + "\n".join(empty)
            assert checked == sum(len(d.panels) for d in DASHBOARDS)
            # The shipped alert rules load and evaluate in this Prometheus.
            rules = (await c.get(f"{prom.url}/api/v1/rules")).json()["data"]["groups"]
            assert sum(len(g["rules"]) for g in rules) >= 11
            assert all(g["rules"] and all(r["health"] == "ok" for r in g["rules"]) for g in rules), rules
    finally:
        prom.stop()
