"""The pure rules: MAC notations, idents, tokens, the boot decision, catalog selection."""

from __future__ import annotations

import pytest

from karios.bootapi import core
from karios.bootapi.core import FallbackReason
from karios.bootapi.settings import BootapiSettings, parse_duration
from karios.common.oscatalog import Catalog, NoCatalogEntry, default_set_dir, load_template_set
from karios.common.oscatalog.catalog import parse_catalog_entry
from tests.fixtures.bootapi_hosts import ALMA, DEBIAN, GATED, NO_OS

TEMPLATES = load_template_set(default_set_dir())


@pytest.mark.parametrize(
    "raw",
    [
        "52:54:00:AA:00:11",
        "52-54-00-aa-00-11",
        "5254.00aa.0011",
        "525400aa0011",
        "525400AA0011",
        "52:54:00:aa:00:11.ipxe",
        "525400aa0011.IPXE",
        " 52:54:00:aa:00:11 ",
    ],
)
def test_every_mac_notation_names_the_same_nic(raw):
    assert core.parse_ipxe_mac(raw) == "52:54:00:aa:00:11"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        None,
        "zz:54:00:aa:00:11",
        "52:54:00:aa:00",
        "52:54:00:aa:00:11:22",
        "../../etc/passwd",
        "52:54:00:aa:00:11.ks",
        "%00",
    ],
)
def test_things_that_are_not_macs_are_refused(raw):
    assert core.parse_ipxe_mac(raw) is None


@pytest.mark.parametrize(
    ("raw", "mac", "name"),
    [
        ("52:54:00:aa:00:11", "52:54:00:aa:00:11", None),
        ("52-54-00-AA-00-11.ks", "52:54:00:aa:00:11", None),
        ("525400aa0011", "52:54:00:aa:00:11", "525400aa0011"),  # bare hex: MAC first, then a name
        ("node-a1.lab.example", None, "node-a1.lab.example"),
        ("node-a1.lab.example.cfg", None, "node-a1.lab.example"),
        ("node-a1.ks", None, "node-a1"),
    ],
)
def test_ks_ident_is_a_mac_or_a_hostname(raw, mac, name):
    assert core.parse_ident(raw) == core.Ident(mac=mac, name=name)


@pytest.mark.parametrize("raw", ["", "../etc", "a b", "x" * 300, "node$(reboot)"])
def test_ks_ident_that_is_neither_is_refused(raw):
    assert core.parse_ident(raw) is None


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        ({"authorization": "Bearer s3cret"}, "s3cret"),
        ({"authorization": "bearer  s3cret "}, "s3cret"),
        ({"token": "s3cret"}, "s3cret"),
        ({"authorization": "Basic abc"}, None),
        ({"authorization": "Bearer "}, None),
        ({}, None),
    ],
)
def test_token_comes_from_bearer_or_a_bare_token_header(headers, token):
    assert core.bearer_token(headers) == token


def test_token_comparison():
    assert core.token_matches("s3cret", "s3cret")
    assert not core.token_matches("s3cre", "s3cret")
    assert not core.token_matches(None, "s3cret")


@pytest.mark.parametrize(
    ("host", "entry", "reason"),
    [
        (None, None, FallbackReason.UNKNOWN),
        (GATED, None, FallbackReason.GATED),
        (NO_OS, None, FallbackReason.NO_CATALOG),
        (ALMA, "almalinux-9", None),
        (DEBIAN, "debian-12", None),
    ],
)
def test_boot_decision(host, entry, reason):
    d = core.decide_boot(host, TEMPLATES)
    assert (d.entry.name if d.entry else None, d.reason) == (entry, reason)


def _entry(name, platforms, roles=()):
    return parse_catalog_entry(
        f"platforms: {list(platforms)}\nroles: {list(roles)}\ninstaller: kickstart\ntemplate: t.j2\n"
        "kernel: http://m/vmlinuz\ninitrd: [http://m/initrd.img]\n",
        default_name=name,
    )


def test_catalog_prefers_an_entry_for_the_hosts_role():
    cat = Catalog.of([_entry("generic", ["alma"]), _entry("gpu", ["alma"], ["gpu"])])
    assert cat.select("alma", "gpu").name == "gpu"
    assert cat.select("ALMA", "compute").name == "generic"
    with pytest.raises(NoCatalogEntry):
        cat.select("debian-12", "gpu")


def test_catalog_refuses_two_entries_for_the_same_platform_and_role():
    with pytest.raises(ValueError, match="both serve platform 'alma'"):
        Catalog.of([_entry("a", ["alma"]), _entry("b", ["alma"])])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("platforms: [x]\n", "installer"),
        ("- a list\n", "mapping"),
        ("platforms: [x\n", "invalid YAML"),
        ("platforms: [x]\ninstaller: windows\ntemplate: t\nkernel: k\ninitrd: [i]\n", "installer"),
        ("platforms: [x]\ninstaller: preseed\ntemplate: t\nkernel: k\ninitrd: [i]\nbogus: 1\n", "bogus"),
    ],
)
def test_bad_catalog_files_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse_catalog_entry(text, default_name="x")


def test_relative_boot_images_are_joined_to_the_repo():
    e = TEMPLATES.catalog.by_name("almalinux-9")
    assert e.kernel_url == "https://repo.almalinux.org/almalinux/9/BaseOS/x86_64/os/images/pxeboot/vmlinuz"
    assert e.initrd_urls == [
        "https://repo.almalinux.org/almalinux/9/BaseOS/x86_64/os/images/pxeboot/initrd.img"
    ]


def test_shipped_catalog_has_alma_fedora_and_debian_preseed():
    by_name = {e.name: e for e in TEMPLATES.catalog.entries}
    assert {"almalinux-9", "fedora", "debian-12"} <= set(by_name)
    assert by_name["debian-12"].installer == "preseed"


@pytest.mark.parametrize(
    ("text", "seconds"), [("3m", 180), ("90s", 90), ("1h30m", 5400), ("250ms", 0.25), ("45", 45), (12, 12)]
)
def test_durations_are_go_style(text, seconds):
    assert parse_duration(text) == seconds


def test_default_settings_follow_the_seed(monkeypatch):
    for k in ("BOOTAPI_TEMPLATE_GIT_INTERVAL", "BOOTAPI_UNKNOWN_MAC_FALLBACK", "BOOTAPI_PROVISION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    s = BootapiSettings()
    assert (s.template_git_interval, s.unknown_mac_fallback, s.provision_token) == (180, "local", None)
    monkeypatch.setenv("BOOTAPI_TEMPLATE_GIT_INTERVAL", "5m")
    monkeypatch.setenv("BOOTAPI_PROVISION_TOKEN", "")
    s = BootapiSettings()
    assert s.template_git_interval == 300 and s.provision_token is None
    assert s.resolved_base_url("0.0.0.0", 8081) == "http://127.0.0.1:8081"
