"""Every script and config bootapi renders, compared byte for byte with its golden file."""

from __future__ import annotations

from pathlib import Path

import pytest

from karios.bootapi import core
from karios.common.oscatalog import default_set_dir, load_template_set
from tests.fixtures.bootapi_hosts import ALMA, DEBIAN, FEDORA
from tests.fixtures.golden import assert_golden

BASE = "http://boot.lab.example:8081"
TOKEN = "golden-token-123"
TEMPLATES = load_template_set(default_set_dir())
GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("host", "entry_name"), [(ALMA, "almalinux-9"), (FEDORA, "fedora"), (DEBIAN, "debian-12")]
)
def test_installer_ipxe_script_matches_golden(host, entry_name):
    entry = TEMPLATES.catalog.select(host.platform, host.role)
    assert entry.name == entry_name
    mac = core.boot_mac(host)
    assert_golden(
        GOLDEN / f"ipxe-{entry_name}.ipxe", core.render_ipxe_script(TEMPLATES, host, mac, entry, BASE)
    )


@pytest.mark.parametrize("fallback", ["local", "shell"])
def test_fallback_scripts_match_golden(fallback):
    assert_golden(
        GOLDEN / f"fallback-{fallback}.ipxe",
        core.render_fallback_script(TEMPLATES, fallback, "52:54:00:00:00:99"),
    )


@pytest.mark.parametrize(
    ("host", "name"), [(ALMA, "almalinux-9.ks"), (FEDORA, "fedora.ks"), (DEBIAN, "debian-12.preseed")]
)
@pytest.mark.parametrize("token", [TOKEN, ""], ids=["callback", "no-token"])
def test_install_configs_match_golden(host, name, token):
    entry = TEMPLATES.catalog.select(host.platform, host.role)
    text = core.render_install_config(
        TEMPLATES, host, entry, mac=core.boot_mac(host), base_url=BASE, provision_token=token
    )
    assert_golden(GOLDEN / f"{name}{'' if token else '.no-token'}", text)


def test_default_configs_call_the_provisioned_endpoint_with_the_token():
    for host in (ALMA, FEDORA, DEBIAN):
        entry = TEMPLATES.catalog.select(host.platform, host.role)
        text = core.render_install_config(
            TEMPLATES, host, entry, mac="", base_url=BASE, provision_token=TOKEN
        )
        assert f"{BASE}/provisioned/{host.name}" in text
        assert f"'Authorization: Bearer {TOKEN}'" in text


def test_kickstart_points_the_network_at_the_booting_nic_not_the_bmc():
    entry = TEMPLATES.catalog.select(ALMA.platform)
    text = core.render_install_config(
        TEMPLATES, ALMA, entry, mac=core.boot_mac(ALMA), base_url=BASE, provision_token=""
    )
    assert "--device=52:54:00:aa:00:11" in text


def test_a_token_with_shell_metacharacters_is_quoted_in_the_kickstart():
    entry = TEMPLATES.catalog.select(ALMA.platform)
    text = core.render_install_config(
        TEMPLATES, ALMA, entry, mac="", base_url=BASE, provision_token="a'b;$(x)"
    )
    assert """-H 'Authorization: Bearer a'"'"'b;$(x)'""" in text
