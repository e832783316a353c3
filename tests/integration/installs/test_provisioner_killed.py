"""The provisioner SIGKILLed mid base-system → the job is ``failed`` with the installer's own words
within seconds of its restart (issue 25 item 1), not ``installing`` until the stage deadline.

The whole system runs as a user runs it: ``karios up`` (embedded NATS and PostgreSQL, every service
a supervised process) with the image method, the Redfish emulator as the BMC, the cached live
images. A provision reaches ``booting``; the callbacks and install functions of the install
script the provisioner put on its medium (``/karios/run.sh``, token and URLs as rendered) run
inside the built live environment (its own sh, curl, zstd, tar and mawk) and stream the real root
archive from the provisioner's ``/images``. Mid-stream the provisioner process is SIGKILLed; the
supervisor restarts it. The transfer is cut short, the installer's failure report meets a gateway
whose provisioner is gone (503) and is retried with backoff until the restarted provisioner
takes it — or, the restart being a fork of ``karios up`` (~1 s), meets the restarted one.

Why not a VM: the same kill in qemu (TCG; the medium booted by its ISO, the VM reaching the
gateway and the provisioner through guestfwd) passed too — 176 MB of the archive unsent, the job
``failed`` with the same words 2.6 s after the provisioner was back, 12.9 s after the kill — but
took 186 s on a quiet machine (72 s of it from power-on to base-system), more than CI should
spend on one fault beside the image chain's installs. What a VM adds — the kernel, the NIC,
qemu's user network — is not what this fault is about; every program that takes part in it is
the real one here. The installer's curl reads at 8 MiB/s (a ``.curlrc`` through ``CURL_HOME``:
the link of a VM under TCG, not loopback's GB/s), so the provisioner dies with most of the
226 MiB archive unsent.

Needs root (the live environment's chroot), the cached live images and sushy-tools.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from karios.provisioner.install import INSTALL_STAGES
from karios.provisioner.install.live import LiveImages
from karios.provisioner.media.cpio import read_initrd
from tests.fixtures.apps import REQUIRE
from tests.fixtures.chaos import KariosUp, http_get, state_dir
from tests.fixtures.chaos_jobs import system_env
from tests.fixtures.installs import LIVE_PATH, SUITE, cached_live_initrd, in_live, live_root  # noqa: F401
from tests.fixtures.provision import bmc_state, served_medium, write_inventory
from tests.fixtures.wait import wait_until_sync
from tests.lab.redfish_lab import RedfishEmulator, fake_system

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(900)]

BMC = "10.99.7.1"
#: The installer's download rate (curl's ``limit-rate``): a VM's link, not loopback's.
RATE = "8M"
#: Extracted bytes on the target before the kill: well into the stream, far from its end.
KILL_AFTER = 24 << 20
NO_PROC = '[ ! -e /proc/self ] || { echo "refusing: /proc is mounted"; exit 99; }\n'


def _need(reason: str) -> None:
    if REQUIRE:
        pytest.fail(reason)
    pytest.skip(reason)


def _medium_script(media_dir: Path, job: str) -> str:
    """The install script of the job's medium (``/karios/run.sh`` of the slot's overlay)."""
    with tempfile.TemporaryDirectory() as tmp:
        iso = served_medium(media_dir / f"{job}.iso", Path(tmp) / "medium.iso")
        out = Path(tmp) / "host.img"
        subprocess.run(
            ["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/karios/host.img", str(out)],
            check=True,
            capture_output=True,
        )
        files = read_initrd(out.read_bytes())
    return files["karios/run.sh"].decode()


def _base_system(script: str, target: str) -> str:
    """The medium's callbacks and install functions, then the stages up to base-system's stream
    (partitioning reported done: nothing is written to a disk here)."""
    start, end = script.index("# -- Karios callbacks"), script.index("# Everything below goes to the log")
    callbacks = script[start:end]
    functions = script[script.index("IMAGE_URL=") : script.index("# -- end of install functions")]
    pct = {s.key: s.percent for s in INSTALL_STAGES}
    main = (
        f"mkdir -p /run {target}\n"
        f"step partitioning done {pct['partitioning']}\n"
        f"step base-system active {pct['base-system']}\n"
        f'stream_root "$IMAGE_URL" {target}\n'
        "echo streamed\n"
    )
    return NO_PROC + callbacks + functions + main


def _extracted(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def _ready_again(up: KariosUp, old_pid: int) -> bool:
    """A new provisioner process answers its ``/readyz``."""
    try:
        if up.service_pid("provisioner") == old_pid:
            return False
    except LookupError:
        return False
    return http_get(f"{up.url('provisioner')}/readyz", timeout=2)[0] == 200


def _step_reports_answered(metrics: str, status: str) -> float:
    """How many step reports the gateway answered with ``status`` (its request counter)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("karios_http_requests_total{")
        and "/step" in line
        and 'method="POST"' in line
        and f'status="{status}"' in line
    )


def _job(gw: httpx.Client, job: str) -> dict:
    r = gw.get(f"/controlnode/job/{job}")
    return r.json() if r.status_code == 200 else {}


def test_provisioner_killed_mid_base_system_fails_the_job_with_the_installers_words(live_root: Path) -> None:  # noqa: F811
    images_dir = cached_live_initrd().parents[1]
    if not LiveImages(images_dir).ready(SUITE):
        _need(f"no built live images at {images_dir} (tests/lab/images.sh builds them)")
    if not shutil.which("xorriso"):
        _need("reading the medium needs xorriso")
    target = f"/tmp/killed-{os.getpid()}"
    with state_dir("karios-killed-") as root, contextlib.ExitStack() as stack:
        try:
            emu = RedfishEmulator([fake_system("killed1")], auth=True).start()
        except Exception as exc:  # pragma: no cover - depends on the machine
            _need(f"sushy-tools emulator unavailable: {exc}")
        stack.callback(emu.stop)
        env = {
            **system_env(emu, [BMC], write_inventory(root / "inventory.yaml", [BMC])),
            "KARIOS_PROVISIONER_INSTALL_METHOD": "image",
            "KARIOS_PROVISIONER_IMAGES_DIR": str(images_dir),
        }
        up = KariosUp(root / "state", env=env)
        stack.callback(up.stop)
        up.wait_started()
        gw = stack.enter_context(
            httpx.Client(base_url=up.url(), headers={"Authorization": f"Bearer {up.token}"}, timeout=60)
        )
        r = gw.post(
            "/controlnode/provision/dell",
            json={"bmc_IP": BMC, "vendor": "dell", "hostname": "killed-node", "install_method": "image"},
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        wait_until_sync(lambda: _job(gw, job).get("job_status") == "booting", timeout=240, what="booting")
        script = _medium_script(up.state / "provisioner" / "media", job)
        image_url = re.search(r"^IMAGE_URL='?([^'\n]+)'?$", script, re.M)
        assert image_url and image_url[1].startswith(up.url("provisioner")), image_url

        curl_home = live_root / f"tmp/curl-{os.getpid()}"
        curl_home.mkdir(parents=True, exist_ok=True)
        (curl_home / ".curlrc").write_text(f"limit-rate = {RATE}\n")
        stack.callback(shutil.rmtree, curl_home, ignore_errors=True)
        stack.callback(shutil.rmtree, live_root / target.lstrip("/"), ignore_errors=True)
        live = subprocess.Popen(
            in_live(live_root, _base_system(script, target)),
            env={"PATH": LIVE_PATH, "CURL_HOME": f"/tmp/{curl_home.name}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stack.callback(lambda: live.poll() is None and (live.kill(), live.wait()))
        wait_until_sync(
            lambda: _extracted(live_root / target.lstrip("/")) >= KILL_AFTER or live.poll() is not None,
            timeout=120,
            interval=0.1,
            what=f"{KILL_AFTER >> 20} MiB of the root extracted",
        )
        assert live.poll() is None, live.communicate()[0]
        assert _job(gw, job)["job_status"] == "installing"

        victim = up.service_pid("provisioner")
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        back = None  # when the restarted provisioner answered /readyz again
        while live.poll() is None and time.monotonic() - killed < 300:
            if back is None and _ready_again(up, victim):
                back = time.monotonic()
            time.sleep(0.2)  # polling two processes at once (the script's pace)
        reported = time.monotonic()
        out, _ = live.communicate(timeout=30)
        wait_until_sync(lambda: _ready_again(up, victim), timeout=60, what="the provisioner restarted")
        back = back or time.monotonic()
        done = wait_until_sync(
            lambda: (v := _job(gw, job)).get("job_status") in {"failed", "stuck", "completed"} and v,
            timeout=60,
            what="the job to end",
        )
        ended = time.monotonic()
        unavailable = _step_reports_answered(gw.get("/metrics").text, "503")
        # The restarted provisioner ended the job as any failure: medium ejected, override cleared.
        wait_until_sync(
            lambda: (b := bmc_state(emu, emu.system_ids[0]))["image"] == "" and b["target"] == "None",
            timeout=30,
            what="the BMC left clean",
        )
    print(
        f"provisioner ready again {back - killed:.1f} s after the kill; installer done "
        f"{reported - killed:.1f} s, job {done.get('job_status')} {ended - killed:.1f} s after it; "
        f"{unavailable:.0f} report(s) answered 503 meanwhile"
    )
    print(f"job: {json.dumps(done)[:600]}")
    assert live.returncode == 1 and "streamed" not in out, out
    assert "NOT delivered" not in out, out
    assert done["job_status"] == "failed", done
    msg = done["message"]
    assert "base-system" in msg and "writing the root filesystem" in msg, msg
    # curl's words come first: the transfer cut short by the server's death.
    assert "curl: (18) " in msg or "curl: (56) " in msg, msg
    # The report met a gateway with no provisioner behind it (503, retried with backoff: the
    # reporter's retries are tests/unit/installs/test_in_live_env.py) or the restarted one (karios
    # up forks it back in ~1 s, often before the installer has said why it failed); either way it
    # was taken within the reporter's backoff of the provisioner's return.
    assert ended - back < 10, (ended - killed, back - killed, unavailable, msg)
