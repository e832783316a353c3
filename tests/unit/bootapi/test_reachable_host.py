"""The installed host is reachable: accounts and SSH keys from the inventory, the primary IPv4 as a
static address (DHCP only without one), for the kickstart and the preseed, checked by the real
validators (pykickstart as ksvalidator runs it, the ksvalidator script, debconf, ``sh -n``)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from karios.bootapi import core
from karios.bootapi.validate import check_kickstart, check_preseed
from karios.common.contracts.inventory import Host, HostInterface, HostUser
from karios.common.oscatalog import default_set_dir, load_template_set
from tests.fixtures.golden import assert_golden

BASE = "http://boot.lab.example:8081"
TEMPLATES = load_template_set(default_set_dir())
GOLDEN = Path(__file__).parent / "golden"
HASH = "$6$rounds=4096$saltsalt$Zx0Q1bO9K0Lk2mQ.hashhashhash"  # a crypt(3)-shaped placeholder
OPS_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps ops@example"
ROOT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRoot root's key"


def host(platform: str, *, ip: str = "10.30.4.21/24", users: bool = True, **kw: object) -> Host:
    return Host(
        id=21,
        name="web-1.lab.example",
        platform=platform,
        primary_ipv4=ip,
        interfaces=[HostInterface(name="eno1", macs=["52:54:00:bb:00:21"])],
        users=[
            HostUser(name="root", ssh_authorized_keys=[ROOT_KEY]),
            HostUser(name="ops", ssh_authorized_keys=[OPS_KEY], sudo=True),
            HostUser(name="dev", password_hash=HASH, shell="/bin/zsh", ssh_authorized_keys=[]),
        ]
        if users
        else [],
        **kw,  # type: ignore[arg-type]
    )


def render(h: Host, token: str = "tok-1") -> str:
    entry = TEMPLATES.catalog.select(h.platform, h.role)
    return core.render_install_config(
        TEMPLATES, h, entry, mac=core.boot_mac(h), base_url=BASE, provision_token=token
    )


ACCESS = host("almalinux-9", ipv4_gateway="10.30.4.254", nameservers=["10.30.0.53", "10.30.0.54"])


@pytest.mark.parametrize("platform", ["almalinux-9", "fedora"])
def test_kickstart_creates_users_with_keys_and_a_static_address(platform, tmp_path):
    text = render(host(platform, ipv4_gateway="10.30.4.254", nameservers=["10.30.0.53", "10.30.0.54"]))
    assert (
        "network --bootproto=static --device=52:54:00:bb:00:21 --ip=10.30.4.21 --netmask=255.255.255.0 "
        "--gateway=10.30.4.254 --nameserver=10.30.0.53,10.30.0.54 --hostname=web-1.lab.example --onboot=yes"
    ) in text
    assert "--bootproto=dhcp" not in text
    assert "rootpw --lock" in text  # root has a key but no password: still locked
    assert f'sshkey --username=root "{ROOT_KEY}"' in text
    assert "user --name=ops --groups=wheel\n" in text
    assert f'sshkey --username=ops "{OPS_KEY}"' in text
    assert f"user --name=dev --shell=/bin/zsh --iscrypted --password={HASH}\n" in text
    assert "echo 'ops ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/karios-ops" in text
    assert "karios-dev" not in text  # dev has a password: no passwordless sudo (and no sudo at all)
    assert check_kickstart(text, tmp_path) == []


def test_kickstart_golden_and_the_ksvalidator_script(tmp_path):
    text = render(ACCESS)
    assert_golden(GOLDEN / "almalinux-9-access.ks", text)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ksvalidator"), str(GOLDEN / "almalinux-9-access.ks")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_a_primary_ipv4_the_kickstart_uses_dhcp_and_without_users_root_stays_locked(tmp_path):
    text = render(host("almalinux-9", ip="", users=False))
    assert (
        "network --bootproto=dhcp --device=52:54:00:bb:00:21 --hostname=web-1.lab.example --activate" in text
    )
    assert "--bootproto=static" not in text and "user --name" not in text and "sshkey" not in text
    assert "rootpw --lock" in text
    assert check_kickstart(text, tmp_path) == []


def test_a_root_password_hash_unlocks_root():
    text = render(
        host("almalinux-9", users=False).model_copy(
            update={"users": [HostUser(name="root", password_hash=HASH)]}
        )
    )
    assert f"rootpw --iscrypted {HASH}\n" in text and "rootpw --lock" not in text


def test_the_gateway_defaults_to_the_networks_first_address():
    assert "--gateway=10.30.4.1 " in render(host("almalinux-9"))
    assert "--gateway" not in render(host("almalinux-9", ip="10.30.4.1/24"))  # the host is .1 itself
    assert "--gateway" not in render(host("almalinux-9", ip="10.30.4.21/32"))


@pytest.mark.parametrize("platform", ["debian-12", "debian-13"])
def test_preseed_creates_users_keys_and_writes_the_static_address(platform, tmp_path):
    text = render(host(platform, ipv4_gateway="10.30.4.254", nameservers=["10.30.0.53"]))
    assert "d-i passwd/make-user boolean true\n" in text and "d-i passwd/username string ops\n" in text
    assert "d-i passwd/user-password-crypted password !\n" in text
    assert "d-i passwd/root-password-crypted password !\n" in text
    assert " sudo\n" in text.split("pkgsel/include string", 1)[1].split("\n", 1)[0] + "\n"
    late = next(ln for ln in text.splitlines() if ln.startswith("d-i preseed/late_command string "))
    cmd = late.removeprefix("d-i preseed/late_command string ")
    assert f"echo '{OPS_KEY}' >> /target/home/ops/.ssh/authorized_keys" in cmd
    assert "echo " + shlex.quote(ROOT_KEY) + " >> /target/root/.ssh/authorized_keys" in cmd
    assert f"in-target useradd -m -s /bin/bash dev; in-target usermod -p '{HASH}' dev" in cmd
    assert "address 10.30.4.21/24\\n    gateway 10.30.4.254" in cmd
    assert "echo 'nameserver 10.30.0.53' > /target/etc/resolv.conf" in cmd
    assert cmd.endswith("/provisioned/web-1.lab.example || true")
    assert check_preseed(text, tmp_path) == []
    assert subprocess.run(["sh", "-n", "-c", cmd], check=False).returncode == 0
    if platform == "debian-12":
        assert_golden(GOLDEN / "debian-12-access.preseed", text)


def test_password_hashes_stay_out_of_reprs_and_logs():
    assert HASH not in repr(ACCESS) and HASH not in str(ACCESS.users)
