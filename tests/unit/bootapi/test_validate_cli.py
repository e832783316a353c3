"""``bootapi validate DIR`` with the real validators (ksvalidator, bash -n, debconf-set-selections)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from karios.bootapi.__main__ import main
from karios.bootapi.validate import debconf_checkonly
from karios.common.oscatalog import default_set_dir

pytestmark = pytest.mark.skipif(
    shutil.which("debconf-set-selections") is None,
    reason="debconf-set-selections not installed (apt-get install debconf)",
)


@pytest.fixture
def template_set(tmp_path: Path) -> Path:
    shutil.copytree(default_set_dir(), tmp_path / "set")
    return tmp_path / "set"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "karios.bootapi", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_shipped_set_passes_every_validator(capsys):
    assert main(["validate", str(default_set_dir())]) == 0
    out = capsys.readouterr().out
    assert "ok    almalinux-9: kickstart/almalinux-9.ks.j2 (kickstart, with callback)" in out
    assert "ok    debian-12: preseed/debian-12.cfg.j2 (preseed, with callback)" in out
    assert "ok    debian-13: preseed/debian-12.cfg.j2 (preseed, with callback)" in out
    assert "ok    ipxe/discover.ipxe.j2" in out  # discovery of unknown servers (issue 27 item 3)
    assert "all 16 checks passed" in out


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("file", "old", "new", "expect"),
    [
        (
            "templates/kickstart/almalinux-9.ks.j2",
            "firewall --enabled --service=ssh",
            "firewall --enabled --service=ssh\nfrobnicate --now",
            "ksvalidator",
        ),
        ("templates/kickstart/almalinux-9.ks.j2", "%packages", "%packages --bogus-option", "ksvalidator"),
        (
            "templates/kickstart/fedora.ks.j2",
            "%pre --interpreter=/bin/bash --log=/tmp/karios-pre.log\n",
            "%pre --interpreter=/bin/bash --log=/tmp/karios-pre.log\nif true; then\n",
            "bash -n on %pre",
        ),
        (
            "templates/snippets/provisioned-callback.sh.j2",
            '|| echo "karios',
            '|| ( echo "karios',
            "bash -n on %post",
        ),
        (
            "templates/preseed/debian-12.cfg.j2",
            "d-i time/zone string",
            "d-i time/zone strnig",
            "debconf-set-selections",
        ),
        (
            "templates/preseed/debian-12.cfg.j2",
            "d-i clock-setup/utc boolean true\n",
            "d-i clock-setup/utc\n",
            "debconf-set-selections",
        ),
        (
            "templates/kickstart/fedora.ks.j2",
            'echo "karios: installing {{ entry.name }} on {{ host.name }}"',
            'echo "karios: installing {{ entry.name }} on {{ host.nmae }}"',
            "render",
        ),
        ("templates/ipxe/boot.ipxe.j2", "#!ipxe\n", "", "#!ipxe"),
    ],
    ids=[
        "unknown-command",
        "bad-option",
        "pre-syntax",
        "post-syntax",
        "preseed-unknown-type-warning",
        "preseed-malformed-line",
        "undefined-variable",
        "ipxe-magic",
    ],
)
def test_a_broken_template_fails_ci_with_a_readable_reason(template_set, file, old, new, expect, capsys):
    edit(template_set / file, old, new)
    assert main(["validate", str(template_set)]) == 1
    out = capsys.readouterr().out
    fails = "\n".join(line for line in out.splitlines() if line.startswith(("FAIL", "  ")))
    assert expect in fails, out


def test_a_set_that_does_not_parse_fails_before_rendering(template_set):
    edit(template_set / "templates/ipxe/boot.ipxe.j2", "{% endfor %}", "")
    proc = run_cli("validate", str(template_set))  # as the templates repo CI runs it
    assert proc.returncode == 1
    assert "FAIL  load" in proc.stdout and "templates/ipxe/boot.ipxe.j2" in proc.stdout


def test_adding_an_os_is_one_yaml_and_one_template(template_set, capsys):
    (template_set / "catalog/rocky-9.yaml").write_text(
        "platforms: [rocky-9]\ninstaller: kickstart\ntemplate: kickstart/rocky-9.ks.j2\n"
        "repo: https://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os/\n"
        "kernel: images/pxeboot/vmlinuz\ninitrd: [images/pxeboot/initrd.img]\n"
    )
    shutil.copy(
        template_set / "templates/kickstart/almalinux-9.ks.j2",
        template_set / "templates/kickstart/rocky-9.ks.j2",
    )
    assert main(["validate", str(template_set)]) == 0
    assert "ok    rocky-9: kickstart/rocky-9.ks.j2" in capsys.readouterr().out


def test_validate_usage_errors_exit_2(tmp_path):
    assert main(["validate", str(tmp_path / "missing")]) == 2


def test_golden_kickstarts_pass_the_ksvalidator_script_itself():
    golden = Path(__file__).parent / "golden"
    files = sorted(str(p) for p in golden.glob("*.ks*"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ksvalidator"), *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    problems = [
        ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("Checking kickstart")
    ]
    assert proc.returncode == 0 and not problems, proc.stdout


def test_golden_preseeds_pass_debconf_checkonly_without_warnings():
    for p in sorted((Path(__file__).parent / "golden").glob("*.preseed*")):
        rc, out = debconf_checkonly(p)
        assert rc == 0 and "warning" not in out.lower(), out


def test_console_script_is_installed():
    assert (Path(sys.executable).parent / "bootapi").exists()
