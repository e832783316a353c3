"""Preseed rendering: golden files, RAID mapping, GPU arguments, debconf and shell syntax checks."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from karios.bootapi.validate import debconf_checkonly
from karios.common.contracts.provision import ProvisionSpec, check_pool
from karios.common.errors import ValidationFailed
from karios.common.provisioning import validate_provision
from karios.provisioner.install import INSTALL_STAGES
from karios.provisioner.install.preseed import render as preseed
from karios.provisioner.install.preseed.render import HostContext, gpu_kernel_args, render_media_files
from tests.fixtures.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden"
HASH = preseed.hash_password("adminadmin", salt="karios12")


def ctx(**kw) -> HostContext:
    base = dict(
        job_id="job-1",
        token="tok-abc",
        callback_base="http://10.0.0.1:8080/controlnode",
        hostname="node1",
        bmc_ip="10.0.0.5",
        os_username="debian",
        password_hash=HASH,
    )
    base.update(kw)
    return HostContext(**base)


CASES = {
    "single": ctx(),
    "mirror_static_gpu": ctx(
        disks=["/dev/sda", "/dev/sdb"],
        md_level=1,
        nic="enp1s0",
        static={
            "address": "10.0.0.50",
            "netmask": "255.255.255.0",
            "gateway": "10.0.0.1",
            "nameservers": "10.0.0.1",
        },
        kernel_args=gpu_kernel_args({"device_ids": ["10DE:2204"]}),
    ),
    "raidz2_root": ctx(disks=[f"/dev/sd{c}" for c in "abcd"], md_level=6, root_password_hash=HASH),
    "wipe": ctx(job_type="unprovision", disks=["/dev/sda", "/dev/nvme0n1"]),
    "dhcp_dns_proxy_security_sol": ctx(
        disks=["vda"],
        nameservers=["10.0.2.3", "192.0.2.53"],
        mirror_host="mirror.example.net",
        mirror_dir="/debian",
        mirror_proxy="http://10.0.2.102:3142",
        security_host="security.example.net",
        updates=True,
        serial_console="ttyS1,57600n8",
        ssh_authorized_keys=[
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheGoldenFileOnly0000000000000 ops@example"
        ],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rendered_files_match_golden(name):
    files = render_media_files(CASES[name])
    for path, text in files.items():
        assert_golden(GOLDEN / f"{name}__{path.replace('/', '_')}", text)


@pytest.mark.skipif(not shutil.which("debconf-set-selections"), reason="debconf not installed")
@pytest.mark.parametrize("name", list(CASES))
def test_preseed_passes_debconf_checkonly_without_warnings(name, tmp_path):
    f = tmp_path / "preseed.cfg"
    f.write_text(render_media_files(CASES[name])["preseed.cfg"])
    rc, out = debconf_checkonly(f)
    assert rc == 0, out
    assert "warning" not in out.lower(), out


@pytest.mark.parametrize("name", list(CASES))
def test_shell_in_scripts_and_commands_parses(name, tmp_path):
    files = render_media_files(CASES[name])
    scripts = [t for p, t in files.items() if p.endswith(".sh")]
    for line in files["preseed.cfg"].splitlines():
        if "_command string " in line:
            scripts.append(line.split("_command string ", 1)[1])
    for i, text in enumerate(scripts):
        f = tmp_path / f"s{i}.sh"
        f.write_text(text)
        res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert res.returncode == 0, (text, res.stderr)


def test_secrets_in_the_medium_are_hashed_and_the_token_is_per_job():
    files = render_media_files(ctx())
    assert "adminadmin" not in "".join(files.values())
    assert "passwd/user-password-crypted password $6$" in files["preseed.cfg"]
    assert "TOKEN='tok-abc'" in files["karios/cb.sh"]
    assert "/job/$JOB/step" in files["karios/cb.sh"] and "/job/$JOB/complete" in files["karios/cb.sh"]
    assert "/firstboot" in files["karios/karios-firstboot.sh"]
    # early_command runs before DHCP: it only starts the reporter, which sends steps once the network is up
    assert "early_command string sh /karios/cb.sh start-reporter" in files["preseed.cfg"]
    assert "early_command string sh /karios/cb.sh step" not in files["preseed.cfg"]
    assert "late_command string" in files["preseed.cfg"] and "cb.sh complete" in files["preseed.cfg"]


def test_the_preseed_answers_what_dhcp_without_dns_and_route_would_ask():
    cfg = render_media_files(CASES["dhcp_dns_proxy_security_sol"])["preseed.cfg"]
    assert "d-i netcfg/get_nameservers string 10.0.2.3 192.0.2.53\n" in cfg
    assert "d-i netcfg/no_default_route boolean true\n" in cfg
    assert "d-i netcfg/disable_autoconfig" not in cfg  # DHCP
    assert "d-i mirror/http/proxy string http://10.0.2.102:3142\n" in cfg
    assert "d-i apt-setup/services-select multiselect security, updates\n" in cfg
    assert "d-i apt-setup/security_host string security.example.net\n" in cfg
    assert "d-i partman-auto/disk string /dev/vda\n" in cfg
    # no name server known: the question is still answered (empty), security and updates off
    plain = render_media_files(ctx())["preseed.cfg"]
    assert "d-i netcfg/get_nameservers string\n" in plain
    assert "d-i apt-setup/services-select multiselect\n" in plain
    assert "d-i mirror/http/proxy string\n" in plain
    assert "apt-setup/security_host" not in plain


def test_serial_console_on_the_installed_system_per_vendor_port():
    files = render_media_files(CASES["dhcp_dns_proxy_security_sol"])
    assert "add-kernel-opts string console=tty0 console=ttyS1,57600n8\n" in files["preseed.cfg"]
    assert 'GRUB_SERIAL_COMMAND="serial --unit=1 --speed=57600"' in files["karios/cb.sh"]
    gpu = render_media_files(CASES["mirror_static_gpu"])["preseed.cfg"]
    assert "add-kernel-opts string console=tty0 console=ttyS0,115200n8 intel_iommu=on" in gpu
    none = render_media_files(ctx(serial_console=""))
    assert "add-kernel-opts" not in none["preseed.cfg"] and "GRUB_SERIAL" not in none["karios/cb.sh"]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"serial_console": "com1"}, "serial_console"),
        ({"mirror_proxy": "http://p:3142\nd-i preseed/late_command string reboot"}, "mirror_proxy"),
        ({"nameservers": ["10.0.0.1\nd-i x"]}, "nameservers"),
        ({"mirror_dir": "/debian\r"}, "mirror_dir"),
    ],
)
def test_values_that_would_break_the_preseed_are_422_naming_the_field(kw, field):
    with pytest.raises(ValidationFailed) as e:
        render_media_files(ctx(**kw))
    assert e.value.field == field and e.value.http_status == 422


def _spec(pool: str, disks: list[str]) -> ProvisionSpec:
    return ProvisionSpec(
        bmc_ip="10.0.0.5", vendor="dell", hostname="node1", pool_type=pool, selected_disks=disks
    )


@pytest.mark.parametrize(
    ("pool", "n", "level"),
    [
        ("single", 1, None),
        ("stripe", 2, 0),
        ("mirror", 2, 1),
        ("raidz1", 3, 5),
        ("raidz2", 4, 6),
        ("mirror", 3, 1),
    ],
)
def test_pool_type_maps_to_md_level(pool, n, level):
    spec = validate_provision(_spec(pool, [f"sd{c}" for c in "abcdef"[:n]]))
    assert (
        check_pool(spec.pool_type, spec.selected_disks)[1] == level and spec.selected_disks[0] == "/dev/sda"
    )


@pytest.mark.parametrize(
    ("pool", "disks", "field"),
    [
        ("single", ["sda", "sdb"], "selected_disks"),
        ("mirror", ["sda"], "selected_disks"),
        ("raidz1", ["sda", "sdb"], "selected_disks"),
        ("raidz2", ["sda", "sdb", "sdc"], "selected_disks"),
        ("raid10", ["sda", "sdb"], "pool_type"),
        ("mirror", ["sda", "sda"], "selected_disks"),
        ("single", ["sda; rm -rf /"], "selected_disks"),
    ],
)
def test_impossible_layouts_are_422_naming_the_field(pool, disks, field):
    with pytest.raises(ValidationFailed) as e:
        validate_provision(_spec(pool, disks))
    assert e.value.field == field and e.value.http_status == 422


def test_nvme_partitions_get_the_p_separator():
    files = render_media_files(ctx(disks=["/dev/nvme0n1", "/dev/nvme1n1"], md_level=1))
    assert "ext4 / /dev/nvme0n1p2#/dev/nvme1n1p2 ." in files["preseed.cfg"]


def test_gpu_passthrough_forms():
    assert gpu_kernel_args(None) == [] and gpu_kernel_args(False) == []
    assert gpu_kernel_args({"enabled": False, "device_ids": ["10de:2204"]}) == []
    assert gpu_kernel_args(True) == ["intel_iommu=on", "amd_iommu=on", "iommu=pt"]
    assert gpu_kernel_args({"iommu": "amd", "ids": ["10de:2204", "10de:1aef"]}) == [
        "amd_iommu=on",
        "iommu=pt",
        "vfio-pci.ids=10de:2204,10de:1aef",
    ]
    with pytest.raises(ValidationFailed) as e:
        gpu_kernel_args(["nvidia"])
    assert e.value.field == "gpu_passthrough"


# -- the installer-side scripts, run for real (sh) against logs recorded from bookworm's d-i ----------
# Only the installer's environment is faked: ``ip`` (an address, so "the network is up") and
# ``logger``; the callbacks go over real HTTP to a recorder on 127.0.0.1.

SH = shutil.which("dash") or shutil.which("sh")
STEP = "/controlnode/job/job-1/step"


@pytest.fixture
def installer(tmp_path):
    """Render the medium's scripts into ``tmp_path/karios`` and return a runner for them."""
    from tests.fixtures.preseed_vm import CallbackRecorder

    if not (SH and shutil.which("wget")):
        pytest.skip("needs sh and wget")
    rec = CallbackRecorder()
    files = render_media_files(ctx(callback_base=f"http://127.0.0.1:{rec.port}/controlnode"))
    (tmp_path / "karios").mkdir()
    for path, text in files.items():
        if path.startswith("karios/"):
            (tmp_path / path).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ip").write_text(
        "#!/bin/sh\necho '2: ens3    inet 10.0.2.15/24 brd 10.0.2.255 scope global ens3'\n"
    )
    (bin_dir / "logger").write_text(f'#!/bin/sh\nshift 2\necho "$*" >>{tmp_path}/karios.log\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KARIOS_SPOOL": str(tmp_path / "spool"),
        "KARIOS_SYSLOG": str(tmp_path / "syslog"),
        "KARIOS_DIR": str(tmp_path / "karios"),
    }
    procs: list[subprocess.Popen] = []

    def run(script: str, *args: str, wait: bool = True) -> subprocess.Popen:
        p = subprocess.Popen([SH, str(tmp_path / "karios" / script), *args], env=env, start_new_session=True)
        procs.append(p)
        if wait:
            p.wait(timeout=60)
        return p

    run.rec = rec  # type: ignore[attr-defined]
    run.tmp = tmp_path  # type: ignore[attr-defined]
    yield run
    for p in procs:  # each ran in a session of its own: also ends the background flushers it left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 9)
        p.wait()
    rec.close()


def _steps(rec) -> list[tuple[str, str]]:
    return [(c.body["step"], c.body["state"]) for c in rec.steps()]


def test_reporter_reports_network_mirror_then_the_missing_component_in_the_installers_words(installer):
    from tests.fixtures.wait import wait_until_sync

    shutil.copy(GOLDEN / "di-syslog-404.log", installer.tmp / "syslog")
    reporter = installer("reporter.sh", wait=False)
    assert reporter.wait(timeout=60) == 0  # it stops after reporting the failure
    rec = installer.rec
    wait_until_sync(lambda: len(rec.steps()) >= 3, timeout=30, what="three callbacks")
    assert _steps(rec) == [("network", "done"), ("mirror", "done"), ("mirror", "failed")]
    assert [c.body.get("percent") for c in rec.steps()[:2]] == [52, 56]
    assert all(c.token == "tok-abc" and c.path == STEP for c in rec.calls)
    fail = rec.failure().body
    assert fail["message"].startswith("retriever/net/error: retrieving apt-mirror-setup 1:0.182; ERROR 404")
    assert "package retrieval failed" in fail["message"]
    assert len(fail["log"]) == 30 and fail["log"][-1].endswith(
        "anna[3243]: WARNING **: package retrieval failed"
    )
    assert not any(" debconf: " in line for line in fail["log"])


def test_reporter_reports_an_unreachable_mirror(installer):
    from tests.fixtures.wait import wait_until_sync

    shutil.copy(GOLDEN / "di-syslog-bad-mirror.log", installer.tmp / "syslog")
    assert installer("reporter.sh", wait=False).wait(timeout=60) == 0
    rec = installer.rec
    wait_until_sync(lambda: rec.failure(), timeout=30, what="the failed callback")
    assert _steps(rec) == [("network", "done"), ("mirror", "failed")]
    msg = rec.failure().body["message"]
    assert (
        msg.startswith("mirror/bad: ") and "mirror does not support the specified release (bookworm)" in msg
    )


def test_stages_are_sent_once_in_order_whoever_reports_them(installer):
    """main-menu items → stages; partman/early_command and late_command report too: no duplicates,
    skipped stages filled in, then complete — in that order, over one queue."""
    from tests.fixtures.wait import wait_until_sync

    menu = ["netcfg", "choose-mirror", "download-installer", "partman-base", "bootstrap-base"]
    menu += ["apt-setup-udeb", "pkgsel", "finish-install"]
    lines = [f"Dec  1 16:00:{i:02d} main-menu[1]: INFO: Menu item '{m}' selected" for i, m in enumerate(menu)]
    (installer.tmp / "syslog").write_text("\n".join(lines) + "\n")
    installer("reporter.sh", wait=False)
    installer("cb.sh", "stage", "partitioning")
    rec = installer.rec
    wait_until_sync(lambda: len(rec.steps()) >= 7, timeout=60, what="seven stages")
    installer("cb.sh", "late-command")
    installer("cb.sh", "complete")
    keys = [c.body["step"] for c in rec.steps()]
    assert keys == [s.key for s in INSTALL_STAGES]
    assert [c.body["percent"] for c in rec.steps()] == [52, 56, 60, 68, 76, 84, 88]
    assert rec.calls[-1].path == "/controlnode/job/job-1/complete" and rec.calls[-1].body == {
        "os_ip": "10.0.2.15"
    }


def test_callbacks_wait_for_the_server_are_retried_in_order_and_never_dropped_silently(installer, tmp_path):
    from tests.fixtures.preseed_vm import CallbackRecorder
    from tests.fixtures.wait import wait_until_sync

    port = installer.rec.port
    installer.rec.close()  # Karios is not answering yet
    installer("cb.sh", "step", "one", "active", "50")
    installer("cb.sh", "step", "two", "active", "51")
    log = tmp_path / "karios.log"
    wait_until_sync(lambda: log.exists() and "retrying" in log.read_text(), timeout=30, what="a retry logged")
    late = CallbackRecorder(port=port)
    try:
        wait_until_sync(
            lambda: len(late.steps()) >= 2, timeout=60, what="both steps after the server came up"
        )
        assert [c.body["step"] for c in late.steps()] == ["one", "two"]
        queue = tmp_path / "spool" / "q"
        wait_until_sync(lambda: not list(queue.iterdir()), timeout=30, what="the queue emptied")
        assert "delivered" in log.read_text()
    finally:
        late.close()


def test_a_failure_message_with_quotes_backslashes_newlines_and_utf8_stays_valid_json(installer):
    from tests.fixtures.wait import wait_until_sync

    (installer.tmp / "syslog").write_text('Dec  1 16:00:00 anna[1]: got "404" for C:\\path\\x\n' * 3)
    said = 'Bad "mirror" \\ at C:\\x\nsecond line ' + "é" * 600
    installer("cb.sh", "failed", said, "mirror")
    rec = installer.rec
    fail = wait_until_sync(rec.failure, timeout=30, what="the failed callback")
    assert fail.body["step"] == "mirror" and fail.body["state"] == "failed"
    # cut to 500 characters, non-ASCII as "?" (a cut never splits a UTF-8 sequence)
    prefix = 'Bad "mirror" \\ at C:\\x second line '
    assert fail.body["message"] == prefix + "?" * (500 - len(prefix))
    assert fail.body["log"] == ['Dec  1 16:00:00 anna[1]: got "404" for C:\\path\\x'] * 3
