"""The service layer with fixed, empty and broken inventories: fallback, gate and callback matrices."""

from __future__ import annotations

import pytest

from karios.bootapi.hosts import CachedHostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.server import BootServer
from karios.bootapi.templatesync import TemplateStore
from karios.common.errors import NotFound, ServiceUnavailable, Unauthorized, UpstreamError
from karios.common.oscatalog import default_set_dir, load_template_set
from tests.fixtures.bootapi_hosts import UNAVAILABLE, BrokenHosts, EmptyHosts, FixedHosts

BASE = "http://boot.lab.example:8081"
TOKEN = "s3cret-token"
TEMPLATES = load_template_set(default_set_dir())
LOCAL = "sanboot --no-describe --drive 0x80"
SHELL = "\nshell\n"


def make_server(hosts, fallback="local", token=TOKEN) -> BootServer:
    metrics = BootapiMetrics()
    store = TemplateStore(metrics)
    store.publish(TEMPLATES)
    return BootServer(
        hosts=CachedHostSource(hosts, metrics),
        templates=store,
        metrics=metrics,
        base_url=BASE,
        fallback=fallback,
        provision_token=token,
    )


def sample(server: BootServer, name: str, labels: dict | None = None) -> float:
    return server.metrics.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.parametrize("fallback", ["local", "shell"])
@pytest.mark.parametrize(
    ("hosts", "mac", "reason"),
    [
        (EmptyHosts(), "52:54:00:aa:00:11", "unknown"),
        (FixedHosts(), "52:54:00:ff:ff:ff", "unknown"),
        (FixedHosts(), "not-a-mac", "bad_mac"),
        (FixedHosts(), None, "bad_mac"),
        (BrokenHosts(), "52:54:00:aa:00:11", "error"),
        (BrokenHosts(UNAVAILABLE), "52:54:00:aa:00:11", "error"),
        (FixedHosts(), "52:54:00:aa:00:14", "gated"),
        (FixedHosts(), "52:54:00:aa:00:15", "no_catalog"),
    ],
    ids=["empty", "unknown", "bad-mac", "no-mac", "broken", "nobody-answers", "gated", "no-catalog"],
)
async def test_ipxe_falls_back_instead_of_failing(hosts, mac, reason, fallback):
    server = make_server(hosts, fallback=fallback)
    script = await server.ipxe_script(mac)
    assert script.startswith("#!ipxe\n")
    assert (LOCAL in script) == (fallback == "local")
    assert (SHELL in script) == (fallback == "shell")
    assert sample(server, "bootapi_ipxe_fallback_total", {"reason": reason}) == 1
    assert sample(server, "bootapi_ipxe_gated_total") == (1 if reason == "gated" else 0)


async def test_ipxe_known_enabled_host_gets_its_installer():
    server = make_server(FixedHosts())
    script = await server.ipxe_script("52-54-00-AA-00-11")
    assert "inst.ks=http://boot.lab.example:8081/ks/node-a1.lab.example" in script
    assert sample(server, "bootapi_render_total", {"kind": "ipxe", "result": "ok"}) == 1


@pytest.mark.parametrize(
    "ident",
    [
        "node-a1.lab.example",
        "52:54:00:aa:00:11",
        "525400aa0011.ks",
        "node-a1.lab.example.cfg",
        "aa-bb-cc-00-00-01",
    ],
)
async def test_ks_by_mac_or_hostname(ident):
    text = await make_server(FixedHosts()).install_config(ident)
    assert text.startswith("# Kickstart for node-a1.lab.example (almalinux-9)")


async def test_ks_for_a_gated_host_is_still_served():
    # Anaconda may re-fetch the kickstart after the callback: the gate only concerns /ipxe.
    assert "node-done" in await make_server(FixedHosts()).install_config("node-done.lab.example")


async def test_preseed_for_debian_host():
    text = await make_server(FixedHosts()).install_config("node-d1.lab.example")
    assert "d-i netcfg/get_hostname string node-d1" in text


@pytest.mark.parametrize(
    ("hosts", "ident", "error"),
    [
        (EmptyHosts(), "node-a1.lab.example", NotFound),
        (FixedHosts(), "52:54:00:ff:ff:ff", NotFound),
        (FixedHosts(), "../../etc/passwd", NotFound),
        (FixedHosts(), "node-windows.lab.example", NotFound),
        (BrokenHosts(), "node-a1.lab.example", UpstreamError),
        (BrokenHosts(UNAVAILABLE), "52:54:00:aa:00:11", UpstreamError),
    ],
)
async def test_ks_errors(hosts, ident, error):
    with pytest.raises(error):
        await make_server(hosts).install_config(ident)


@pytest.mark.parametrize(
    ("token", "headers", "hosts", "ident", "error", "result"),
    [
        (TOKEN, {"authorization": f"Bearer {TOKEN}"}, FixedHosts(), "node-a1.lab.example", None, "ok"),
        (TOKEN, {"token": TOKEN}, FixedHosts(), "52-54-00-aa-00-11", None, "ok"),
        (TOKEN, {}, FixedHosts(), "node-a1.lab.example", Unauthorized, "unauthorized"),
        (
            TOKEN,
            {"authorization": "Bearer wrong"},
            FixedHosts(),
            "node-a1.lab.example",
            Unauthorized,
            "unauthorized",
        ),
        (
            TOKEN,
            {"authorization": f"Bearer {TOKEN}"},
            FixedHosts(),
            "nobody.lab.example",
            NotFound,
            "notfound",
        ),
        (
            None,
            {"authorization": f"Bearer {TOKEN}"},
            FixedHosts(),
            "node-a1.lab.example",
            ServiceUnavailable,
            "disabled",
        ),
        (
            TOKEN,
            {"authorization": f"Bearer {TOKEN}"},
            BrokenHosts(),
            "node-a1.lab.example",
            UpstreamError,
            "error",
        ),
        (
            TOKEN,
            {"authorization": f"Bearer {TOKEN}"},
            BrokenHosts(UNAVAILABLE),
            "node-a1.lab.example",
            UpstreamError,
            "error",
        ),
    ],
    ids=[
        "bearer",
        "bare-token",
        "missing",
        "wrong",
        "unknown",
        "no-token-configured",
        "write-fails",
        "nobody-answers",
    ],
)
async def test_provisioned_matrix(token, headers, hosts, ident, error, result):
    server = make_server(hosts, token=token)
    if error is None:
        await server.provisioned(ident, headers)
        assert hosts.pxe_writes and hosts.pxe_writes[0][1] is False
    else:
        with pytest.raises(error):
            await server.provisioned(ident, headers)
        assert not getattr(hosts, "pxe_writes", [])
    assert sample(server, "bootapi_provisioned_total", {"result": result}) == 1


async def test_provisioned_host_is_gated_on_its_next_pxe_boot():
    hosts = FixedHosts()
    server = make_server(hosts)
    assert "inst.ks=" in await server.ipxe_script("52:54:00:aa:00:11")  # now cached
    await server.provisioned("node-a1.lab.example", {"token": TOKEN})
    assert LOCAL in await server.ipxe_script("52:54:00:aa:00:11")


async def test_rendered_scripts_are_reused_until_the_host_or_templates_change():
    hosts = FixedHosts()
    server = make_server(hosts)
    first = await server.ipxe_script("52:54:00:aa:00:11")
    assert await server.ipxe_script("52:54:00:aa:00:11") is first  # same cached Host: no re-render
    changed = hosts.hosts["node-a1.lab.example"].model_copy(update={"platform": "fedora"})
    hosts.hosts["node-a1.lab.example"] = changed
    server.hosts.invalidate(name=changed.name)
    assert "installs fedora" in await server.ipxe_script("52:54:00:aa:00:11")
    server.templates.publish(load_template_set(default_set_dir(), origin="next"))
    assert await server.ipxe_script("52:54:00:aa:00:11") is not first
