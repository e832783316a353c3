"""The console's day-2 view models (issue 26 item 5): the job page's request facts and its retry,
the servers view (inventory joined with the last job and the hardware record), its search and
paging, discovered servers, and where a login may send the browser back to."""

from __future__ import annotations

import pytest

from karios.api_gateway.auth import Role
from karios.api_gateway.console import views
from karios.common.contracts.discovery import DiscoveredServer
from karios.common.contracts.hardware import Drive, HardwareRecord, PcieDevice, SystemInfo
from karios.common.contracts.inventory import NodeSummary
from karios.common.contracts.nodes import ComputeNode
from karios.common.contracts.provision import JobRequestView

OPERATOR, VIEWER = views.controls_for(Role.operator), views.controls_for(Role.viewer)
T0 = "2026-12-01T10:00:00+00:00"


def job(status: str = "failed", job_type: str = "provision", **kw) -> dict:
    return {
        "id": "0f3e9c1a-1111-2222-3333-444455556666",
        "bmc_ip": "10.0.0.1",
        "job_type": job_type,
        "job_status": status,
        "status": status,
        "progress": 40,
        "message": "",
        "resource_name": "node-01",
        "updated_at": T0,
        **kw,
    }


def request_view(**kw) -> JobRequestView:
    base = {
        "job_id": "0f3e9c1a-1111-2222-3333-444455556666",
        "bmc_ip": "10.0.0.1",
        "vendor": "dell",
        "hostname": "node-01",
        "debian_version": "13",
        "install_method": "preseed",
        "method": "preseed",
        "selected_disks": ["sda", "sdb"],
        "pool_type": "mirror",
        "ssh_authorized_keys": ["ssh-ed25519 AAAA op@example"],
        "metadata": {"rack_number": "R12"},
    }
    return JobRequestView(**{**base, **kw})


def test_job_facts_name_host_os_method_and_who_started_it():
    facts = views.job_facts(job(), request_view(), actor="alice", role="operator", at=T0)
    assert (facts.hostname, facts.os, facts.method, facts.vendor) == (
        "node-01",
        "Debian 13",
        "preseed",
        "dell",
    )
    assert (facts.started_by, facts.started_at) == ("alice (operator)", "10:00:00")


def test_job_facts_say_which_method_ran_when_it_differs_from_the_request_and_fall_back_to_the_job():
    facts = views.job_facts(job(), request_view(install_method="", method="image"), actor="", role="", at="")
    assert facts.method == "image" and facts.started_by == "" and facts.started_at == ""
    unknown = views.job_facts(job(resource_name="from-row"), None, actor="", role="", at="")
    assert (unknown.hostname, unknown.os, unknown.method) == ("from-row", "", "")


def test_retry_sends_the_same_request_again_without_secrets_and_asks_for_them():
    r = views.retry_of(job(), request_view(has_os_password=True), OPERATOR)
    assert r is not None
    assert r.body == {
        "bmc_IP": "10.0.0.1",
        "vendor": "dell",
        "hostname": "node-01",
        "debian_version": "13",
        "arch": "amd64",
        "os_username": "debian",
        "selected_disks": ["sda", "sdb"],
        "pool_type": "mirror",
        "ssh_authorized_keys": ["ssh-ed25519 AAAA op@example"],
        "install_method": "preseed",
        "rack_number": "R12",
    }
    assert r.needs_os_password and not r.needs_root_pass
    assert not any("pass" in k for k in r.body)
    # A catalog image is asked for again too, and the job page names it as the OS.
    image = request_view(image="debian-cloud", install_method="image", method="image")
    again = views.retry_of(job(), image, OPERATOR)
    assert again is not None and again.body["image"] == "debian-cloud"
    assert views.job_facts(job(), image, actor="", role="", at="").os == "image debian-cloud"


@pytest.mark.parametrize(
    ("status", "job_type", "controls", "offered"),
    [
        ("failed", "provision", OPERATOR, True),
        ("cancelled", "provision", OPERATOR, True),
        ("stuck", "provision", OPERATOR, True),
        ("failed", "provision", VIEWER, False),  # a viewer gets no retry control at all
        ("running", "provision", OPERATOR, False),
        ("completed", "provision", OPERATOR, False),
        ("failed", "unprovision", OPERATOR, False),
    ],
)
def test_retry_is_offered_on_ended_provisions_to_operators_only(status, job_type, controls, offered):
    req = request_view(job_type=job_type)
    assert (views.retry_of(job(status, job_type), req, controls) is not None) is offered
    assert views.retry_of(job(status, job_type), None, controls) is None  # request unknown: no retry


def servers() -> list[views.ServerLine]:
    registry = [
        NodeSummary(bmc_ip="10.0.0.10", hostname="db-1", vendor="dell", serial_number="SN10"),
        NodeSummary(bmc_ip="10.0.0.9", fqdn="web-1.example", node_ip="192.0.2.9"),
    ]
    compute = [
        ComputeNode(node_ip="192.0.2.9", hostname="web-1", bmc_ip="10.0.0.9"),
        ComputeNode(node_ip="192.0.2.50", hostname="byo-node"),  # adopted, no BMC
    ]
    jobs = [job("failed", bmc_ip="10.0.0.9", resource_name="web-1"), job("running", bmc_ip="10.0.0.77")]
    return views.server_lines(registry, compute, jobs)


def test_servers_join_the_registry_compute_nodes_and_jobs_by_bmc():
    lines = servers()
    assert [s.bmc_ip for s in lines] == ["10.0.0.9", "10.0.0.10", "10.0.0.77", "192.0.2.50"]
    web = lines[0]
    assert web.hostname == "web-1.example" and web.node_ip == "192.0.2.9"
    assert web.sources == ("registry", "compute node", "jobs")
    assert web.last_job is not None and web.state == "failed"
    db = lines[1]
    assert db.last_job is None and db.state == "none" and db.serial == "SN10"
    assert lines[2].sources == ("jobs",) and lines[2].hostname == "node-01"


@pytest.mark.parametrize(
    ("q", "state", "found"),
    [
        ("", "", ["10.0.0.9", "10.0.0.10", "10.0.0.77", "192.0.2.50"]),
        ("WEB", "", ["10.0.0.9"]),  # hostname, any case
        ("sn10", "", ["10.0.0.10"]),  # serial
        ("192.0.2.", "", ["10.0.0.9", "192.0.2.50"]),  # node address
        ("", "none", ["10.0.0.10", "192.0.2.50"]),
        ("", "running", ["10.0.0.77"]),
        ("web", "running", []),
    ],
)
def test_servers_search_and_filter_by_last_job(q, state, found):
    assert [s.bmc_ip for s in views.filter_servers(servers(), q, state)] == found


def test_hardware_record_summarised_on_its_server():
    rec = HardwareRecord(
        bmc_ip="10.0.0.10",
        inspected_at=T0,
        driver="dell",
        system=SystemInfo(manufacturer="Dell Inc.", model="PowerEdge R650", power_state="On", serial="HW1"),
        processor_count=2,
        memory_total_gib=256.0,
        drives=[Drive(name="sda"), Drive(name="sdb")],
        gpus=[PcieDevice(id="gpu0")],
    )
    lines = views.with_hardware(servers(), {"10.0.0.10": rec})
    db = next(s for s in lines if s.bmc_ip == "10.0.0.10")
    assert db.hardware == "Dell Inc. PowerEdge R650 · 2 CPU · 256 GiB · 2 drives · 1 GPU"
    assert db.power == "On" and db.serial == "SN10"  # the registry's serial wins
    assert next(s for s in lines if s.bmc_ip == "10.0.0.9").hardware == ""


def test_page_of_says_whether_pages_come_before_and_after():
    items = list(range(7))
    assert views.page_of(items, 1, 3) == views.Page([0, 1, 2], 1, False, True)
    assert views.page_of(items, 3, 3) == views.Page([6], 3, True, False)
    assert views.page_of(items, 9, 3) == views.Page([], 9, True, False)


def test_discovered_servers_adoptable_by_operators_until_adopted():
    found = [
        DiscoveredServer(
            id="d1",
            status="discovered",
            boot_mac="52:54:00:00:00:01",
            system=SystemInfo(manufacturer="QEMU", model="Standard PC"),
            processor_model="EPYC",
            memory_mib=8192,
            drives=[Drive(name="vda")],
            first_seen=T0,
            last_seen=T0,
        ),
        DiscoveredServer(
            id="d2",
            status="adopted",
            boot_mac="52:54:00:00:00:02",
            hostname="n2",
            first_seen=T0,
            last_seen=T0,
        ),
    ]
    lines = views.discovered_lines(found, OPERATOR)
    assert lines[0].summary == "QEMU Standard PC · EPYC · 8 GiB · 1 drive" and lines[0].adoptable
    assert not lines[1].adoptable
    assert not any(d.adoptable for d in views.discovered_lines(found, VIEWER))


@pytest.mark.parametrize(
    ("path", "back"),
    [
        ("/console/servers?q=web&state=failed", "/console/servers?q=web&state=failed"),
        ("/console/jobs/0f3e9c1a", "/console/jobs/0f3e9c1a"),
        ("//evil.example/console/", ""),
        ("https://evil.example/console/jobs", ""),
        ("/console//evil.example", ""),
        ("/console/../controlnode/tokens", ""),
        ("/console/\\evil.example", ""),
        ("/console/login?next=/console/jobs", ""),
        ("/controlnode/tokens", ""),
        ("", ""),
    ],
)
def test_login_goes_back_only_to_a_console_page_of_this_site(path, back):
    assert views.safe_next(path) == back
