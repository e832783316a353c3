"""Discovery of unknown servers (issue 27 item 3), bootapi's part: with ``BOOTAPI_DISCOVERY_ENABLED``
an unknown MAC gets the live environment in discovery mode — the provisioner's kernel and live.img,
the discovery overlay of this boot, the live environment's kernel line and a discovery token that
names this MAC and expires — while every other fallback case stays the fallback; off by default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from karios.bootapi.app import create_app
from karios.bootapi.core import DiscoveryBoot
from karios.bootapi.hosts import CachedHostSource
from karios.bootapi.metrics import BootapiMetrics
from karios.bootapi.server import BootServer
from karios.bootapi.settings import BootapiSettings
from karios.bootapi.templatesync import TemplateStore
from karios.common.discovery_token import DiscoveryTokenExpired, DiscoveryTokens
from karios.common.oscatalog import default_set_dir, load_template_set
from karios.common.settings import KariosSettings
from tests.fixtures.bootapi_hosts import UNAVAILABLE, BrokenHosts, EmptyHosts, FixedHosts
from tests.fixtures.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden"
TEMPLATES = load_template_set(default_set_dir())
TOKENS = DiscoveryTokens({"k1": b"k" * 32}, "k1")
IMAGES = "http://10.0.0.1:8082"
NOW = 1_800_000_000.0
UNKNOWN = "52:54:00:aa:99:01"
LOCAL = "sanboot --no-describe --drive 0x80"


def make_server(hosts, *, discovery: bool = True) -> BootServer:
    metrics = BootapiMetrics()
    store = TemplateStore(metrics)
    store.publish(TEMPLATES)
    extra = (
        {
            "discovery": DiscoveryBoot(IMAGES, "bookworm", ("console=tty0", "console=ttyS0,115200n8")),
            "discovery_tokens": TOKENS,
            "discovery_ttl": 600.0,
            "clock": lambda: NOW,
        }
        if discovery
        else {}
    )
    return BootServer(
        hosts=CachedHostSource(hosts, metrics),
        templates=store,
        metrics=metrics,
        base_url="http://boot.lab.example:8081",
        **extra,
    )


def token_of(script: str) -> str:
    (token,) = re.findall(r" karios\.discovery=(\S+)", script)
    return token


async def test_an_unknown_mac_boots_the_live_environment_in_discovery_mode():
    server = make_server(EmptyHosts())
    script = await server.ipxe_script("52-54-00-AA-99-01")  # any notation
    token = token_of(script)
    assert TOKENS.verify(token, now=NOW) == UNKNOWN
    assert TOKENS.verify(token, now=NOW + 600) == UNKNOWN
    with pytest.raises(DiscoveryTokenExpired):
        TOKENS.verify(token, now=NOW + 601)
    assert_golden(GOLDEN / "discover.ipxe", script.replace(token, "<token>"))
    lines = script.splitlines()
    assert lines[0] == "#!ipxe"
    assert (
        f"kernel {IMAGES}/images/bookworm/vmlinuz initrd=live.img initrd=overlay.img rdinit=/init" in script
    )
    assert f"initrd {IMAGES}/images/bookworm/live.img" in lines
    assert f"initrd {IMAGES}/discovery/{token}/overlay.img" in lines
    assert lines[-1] == "boot"
    registry = server.metrics.registry
    assert registry.get_sample_value("bootapi_ipxe_discovery_total") == 1
    assert registry.get_sample_value("bootapi_ipxe_fallback_total", {"reason": "unknown"}) is None


@pytest.mark.parametrize(
    ("hosts", "mac", "reason"),
    [
        (FixedHosts(), "not-a-mac", "bad_mac"),
        (BrokenHosts(), "52:54:00:aa:00:11", "error"),
        (BrokenHosts(UNAVAILABLE), "52:54:00:aa:00:11", "error"),
        (FixedHosts(), "52:54:00:aa:00:14", "gated"),
        (FixedHosts(), "52:54:00:aa:00:15", "no_catalog"),
    ],
    ids=["bad-mac", "inventory-broken", "nobody-answers", "gated", "no-catalog"],
)
async def test_only_an_unknown_mac_is_discovered(hosts, mac, reason):
    """A known host (gated, no catalog entry) or an inventory failure keeps the safe fallback:
    discovery powers a machine off, which a known host's PXE boot must never do."""
    server = make_server(hosts)
    script = await server.ipxe_script(mac)
    assert LOCAL in script and "karios.discovery=" not in script
    assert server.metrics.registry.get_sample_value("bootapi_ipxe_fallback_total", {"reason": reason}) == 1


async def test_a_known_host_still_installs_with_discovery_on():
    script = await make_server(FixedHosts()).ipxe_script("52:54:00:aa:00:11")
    assert "installs almalinux-9" in script and "karios.discovery=" not in script


async def test_discovery_is_off_by_default():
    assert BootapiSettings(_env_file=None).discovery_enabled is False  # type: ignore[call-arg]
    script = await make_server(EmptyHosts(), discovery=False).ipxe_script(UNKNOWN)
    assert LOCAL in script and "karios.discovery=" not in script


async def test_each_answer_has_its_own_token():
    """Not memoized as the fallback is: a token carries its expiry."""
    server = make_server(EmptyHosts())
    clock = iter([NOW, NOW + 5])
    server.clock = lambda: next(clock)
    assert token_of(await server.ipxe_script(UNKNOWN)) != token_of(await server.ipxe_script(UNKNOWN))


async def test_a_template_set_without_the_discovery_script_uses_the_embedded_one():
    own = load_template_set(default_set_dir())
    sources = {k: v for k, v in own.sources.items() if k != "ipxe/discover.ipxe.j2"}
    server = make_server(EmptyHosts())
    server.templates.publish(type(own)(catalog=own.catalog, sources=sources, origin="git"))
    assert "karios.discovery=" in await server.ipxe_script(UNKNOWN)


def test_settings_wire_discovery_with_the_key_ring_and_the_provisioner_url():
    settings = KariosSettings(_env_file=None, dev_mode=True, host="10.1.2.3", provisioner_port=9082)  # type: ignore[call-arg]
    boot = BootapiSettings(_env_file=None, discovery_enabled=True, discovery_token_ttl="10m")  # type: ignore[call-arg]
    server = create_app(settings, boot, host_source=EmptyHosts()).state.server
    assert server.discovery == DiscoveryBoot(
        "http://10.1.2.3:9082", "bookworm", ("console=tty0", "console=ttyS0,115200n8")
    )
    assert server.discovery_ttl == 600.0
    # The gateway and the provisioner derive the same keys from the same key ring.
    token = server.discovery_tokens.issue(UNKNOWN, now=NOW)
    assert DiscoveryTokens.from_settings(settings).verify(token, now=NOW) == UNKNOWN
