"""A failed preseed install powers the server off like the image path (issue 25 item 1): the
installer's ``cb.sh failed`` delivers its report first, then writes ``o`` to the sysrq trigger
(here a file: ``KARIOS_SYSRQ``; outside the installer and without it nothing is written)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from karios.provisioner.install.preseed.render import HostContext, hash_password, render_media_files


def _installer(tmp_path: Path, port: int) -> dict[str, str]:
    ctx = HostContext(
        job_id="job-off",
        token="tok-off",
        callback_base=f"http://127.0.0.1:{port}/controlnode",
        hostname="n1",
        bmc_ip="10.0.0.5",
        os_username="debian",
        password_hash=hash_password("x", salt="karios12"),
    )
    (tmp_path / "karios").mkdir()
    for path, text in render_media_files(ctx).items():
        if path.startswith("karios/"):
            (tmp_path / path).write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ip").write_text("#!/bin/sh\necho '2: ens3    inet 10.0.2.15/24 scope global ens3'\n")
    (bindir / "logger").write_text(f'#!/bin/sh\nshift 2\necho "$*" >>{tmp_path}/karios.log\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    (tmp_path / "syslog").write_text("Dec  1 16:00:00 anna[1]: package retrieval failed\n")
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "KARIOS_SPOOL": str(tmp_path / "spool"),
        "KARIOS_SYSLOG": str(tmp_path / "syslog"),
        "KARIOS_DIR": str(tmp_path / "karios"),
    }


def test_a_failed_preseed_install_powers_off_after_its_report(tmp_path: Path) -> None:
    from tests.fixtures.preseed_vm import CallbackRecorder

    if not shutil.which("wget"):
        pytest.skip("needs wget (the installer's HTTP client)")
    rec = CallbackRecorder()
    try:
        env = _installer(tmp_path, rec.port)
        sysrq = tmp_path / "sysrq-trigger"
        cb = str(tmp_path / "karios" / "cb.sh")
        run = subprocess.run(
            ["sh", cb, "failed", "Bad archive mirror", "mirror"],
            env={**env, "KARIOS_SYSRQ": str(sysrq)},
            timeout=120,
            start_new_session=True,
        )
        assert run.returncode == 0
        fail = rec.failure()
        assert fail is not None and fail.body["message"] == "Bad archive mirror", rec.calls
        assert sysrq.read_text() == "o\n"  # after the report: drain returned first
        assert "install failed: powering off" in (tmp_path / "karios.log").read_text()

        # Outside the installer (no /lib/debian-installer.d) and without KARIOS_SYSRQ: no power-off.
        assert not Path("/lib/debian-installer.d").exists()
        script = (tmp_path / "karios" / "cb.sh").read_text()
        assert "SYSRQ=${KARIOS_SYSRQ:-}" in script and "[ -d /lib/debian-installer.d ]" in script
    finally:
        rec.close()
