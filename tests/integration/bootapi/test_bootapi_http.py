"""bootapi over HTTP against the real NATS, with a real (tiny) inventory responder on the bus."""

from __future__ import annotations

import httpx
import pytest

from karios.bootapi.app import create_app
from tests.fixtures.bootapi import TOKEN, boot_settings
from tests.fixtures.wait import wait_until

LOCAL = "sanboot --no-describe --drive 0x80"


@pytest.mark.parametrize(
    "path",
    [
        "/ipxe/52:54:00:aa:00:11",
        "/ipxe/52-54-00-AA-00-11",
        "/ipxe/5254.00aa.0011",
        "/ipxe/525400aa0011.ipxe",
        "/boot/ipxe?mac=52:54:00:aa:00:11",
        "/boot/ipxe?mac=525400AA0011",
    ],
)
async def test_ipxe_any_notation_serves_the_installer(bootapi, path):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text.startswith("#!ipxe\n") and "inst.ks=http://127.0.0.1:8081/ks/node-a1.lab.example" in r.text


@pytest.mark.parametrize(
    "path",
    [
        "/ipxe/52:54:00:ff:ff:ff",
        "/ipxe/52:54:00:aa:00:14",
        "/ipxe/not-a-mac",
        "/ipxe/52:54:00:aa:00:15",
        "/boot/ipxe",
        "/boot/ipxe?mac=zz",
    ],
    ids=["unknown", "gated", "bad-mac", "no-catalog", "no-mac", "bad-query"],
)
async def test_ipxe_never_404s(bootapi, path):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.get(path)
    assert r.status_code == 200 and r.text.startswith("#!ipxe\n") and LOCAL in r.text


async def test_ipxe_inventory_error_serves_fallback_and_ks_answers_502(bootapi, inventory):
    inventory.broken = True
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.get("/ipxe/52:54:00:aa:00:12")
        assert r.status_code == 200 and LOCAL in r.text
        r = await c.get("/ks/node-f1.lab.example")
        assert r.status_code == 502 and r.json()["code"] == "UPSTREAM_ERROR"


async def test_without_any_inventory_ipxe_falls_back_and_ks_is_502(settings, serve):
    settings.request_timeout = 0.3
    app = await serve(create_app(settings, boot_settings(unknown_mac_fallback="shell")))
    async with httpx.AsyncClient(base_url=app.url) as c:
        r = await c.get("/ipxe/52:54:00:aa:00:11")
        assert r.status_code == 200 and r.text.endswith("\nshell\n")
        assert (await c.get("/ks/node-a1.lab.example")).status_code == 502
        assert (await c.get("/readyz")).status_code == 200  # readiness does not probe the inventory


@pytest.mark.parametrize(
    ("path", "first_line"),
    [
        ("/ks/node-a1.lab.example", "# Kickstart for node-a1.lab.example (almalinux-9)"),
        ("/ks/52:54:00:aa:00:11.ks", "# Kickstart for node-a1.lab.example (almalinux-9)"),
        ("/ks/node-f1.lab.example.cfg", "# Kickstart for node-f1.lab.example (fedora)"),
        ("/ks/52-54-00-aa-00-13", "# Preseed for node-d1.lab.example (debian-12)"),
    ],
)
async def test_ks_renders_for_mac_or_hostname(bootapi, path, first_line):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.get(path)
    assert r.status_code == 200 and r.text.startswith(first_line)


@pytest.mark.parametrize(
    "path",
    ["/ks/nobody.lab.example", "/ks/52:54:00:ff:ff:ff", "/ks/..%2F..%2Fetc", "/ks/node-windows.lab.example"],
)
async def test_ks_unknown_host_is_404(bootapi, path):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.get(path)
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("headers", "ident", "status"),
    [
        ({"Authorization": f"Bearer {TOKEN}"}, "node-a1.lab.example", 204),
        ({"token": TOKEN}, "52:54:00:aa:00:12", 204),
        ({}, "node-a1.lab.example", 401),
        ({"Authorization": "Bearer nope"}, "node-a1.lab.example", 401),
        ({"Authorization": f"Basic {TOKEN}"}, "node-a1.lab.example", 401),
        ({"Authorization": f"Bearer {TOKEN}"}, "nobody.lab.example", 404),
    ],
)
async def test_provisioned_auth_matrix(bootapi, inventory, headers, ident, status):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.post(f"/provisioned/{ident}", headers=headers)
    assert r.status_code == status, r.text
    assert bool(inventory.table.pxe_writes) == (status == 204)


async def test_provisioned_write_failure_is_502(bootapi, inventory):
    inventory.broken = True
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        r = await c.post("/provisioned/node-a1.lab.example", headers={"token": TOKEN})
    assert r.status_code == 502


async def test_provisioned_without_configured_token_is_503(settings, inventory, serve):
    app = await serve(create_app(settings, boot_settings(provision_token="")))
    async with httpx.AsyncClient(base_url=app.url) as c:
        r = await c.post("/provisioned/node-a1.lab.example", headers={"token": "anything"})
    assert r.status_code == 503 and not inventory.table.pxe_writes


async def test_install_then_callback_then_next_boot_is_local(bootapi, inventory):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        assert "inst.ks=" in (await c.get("/ipxe/52:54:00:aa:00:11")).text
        ks = (await c.get("/ks/node-a1.lab.example")).text
        assert f"Bearer {TOKEN}" in ks and "/provisioned/node-a1.lab.example" in ks
        assert (
            await c.post("/provisioned/node-a1.lab.example", headers={"Authorization": f"Bearer {TOKEN}"})
        ).status_code == 204
        assert LOCAL in (await c.get("/ipxe/52:54:00:aa:00:11")).text
    assert inventory.table.hosts["node-a1.lab.example"].pxe_enabled is False


async def test_device_changed_event_invalidates_the_cache(bootapi, inventory):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        assert "almalinux-9" in (await c.get("/ipxe/52:54:00:aa:00:11")).text
        for _ in range(5):
            await c.get("/ipxe/52:54:00:aa:00:11")
        assert inventory.lookups == 1  # served from the cache
        host = inventory.table.hosts["node-a1.lab.example"]
        host.platform = "debian-12"  # re-imaged as Debian in NetBox
        await inventory.changed(host)

        async def reimaged() -> str | None:
            text = (await c.get("/ipxe/52:54:00:aa:00:11")).text
            return text if "debian-12" in text else None

        text = await wait_until(reimaged, what="the Debian script after the change")
        assert "installs debian-12" in text


async def test_ops_endpoints_and_metric_names(bootapi):
    async with httpx.AsyncClient(base_url=bootapi.url) as c:
        assert (await c.get("/healthz")).text == "ok\n"
        assert (await c.get("/readyz")).status_code == 200
        await c.get("/ipxe/52:54:00:aa:00:11")
        await c.get("/ipxe/52:54:00:aa:00:14")
        await c.get("/ks/nobody")
        await c.post("/provisioned/x", headers={"token": "bad"})
        text = (await c.get("/metrics")).text
    for line in (
        'bootapi_http_requests_total{endpoint="ipxe",status="2xx"} 2.0',
        'bootapi_http_requests_total{endpoint="ks",status="4xx"} 1.0',
        'bootapi_http_requests_total{endpoint="healthz",status="2xx"} 1.0',
        'bootapi_render_total{kind="ipxe",result="ok"} 2.0',
        'bootapi_netbox_lookups_total{field="mac",result="ok"} 2.0',
        'bootapi_netbox_lookups_total{field="name",result="notfound"} 1.0',
        "bootapi_netbox_cache_misses_total 3.0",
        'bootapi_provisioned_total{result="unauthorized"} 1.0',
        "bootapi_ipxe_gated_total 1.0",
        "bootapi_template_sync_total 0.0",
        "bootapi_template_sync_failures_total 0.0",
        "bootapi_template_generation 1.0",
    ):
        assert line in text, line
    assert "bootapi_netbox_lookup_duration_seconds_bucket" in text and "process_cpu_seconds_total" in text
    assert TOKEN not in text


async def test_the_token_never_reaches_logs_or_metrics(settings, inventory, serve, capfd):
    settings.log_level = "DEBUG"
    app = await serve(create_app(settings, boot_settings()))
    async with httpx.AsyncClient(base_url=app.url) as c:
        await c.get("/ks/node-a1.lab.example")
        await c.post("/provisioned/node-a1.lab.example", headers={"Authorization": f"Bearer {TOKEN}"})
        await c.post("/provisioned/node-a1.lab.example", headers={"Authorization": f"Bearer {TOKEN}x"})
        metrics = (await c.get("/metrics")).text
    out, err = capfd.readouterr()
    assert "provisioned callback" in out + err  # the callback is logged...
    assert TOKEN not in out + err + metrics  # ...without the token
