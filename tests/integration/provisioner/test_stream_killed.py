"""The server of the root archive dies mid-stream → the job is ``failed`` with the installer's own
words within seconds, not ``installing`` until the stage deadline (issue 25 item 1).

The image install's streaming step (``stream_root`` of ``install.sh.j2``, with the callbacks it
reports through) runs inside the built live environment — its own sh, curl, zstd, tar and mawk —
against a real HTTP server process serving a root archive, which is SIGKILLed once half the body
is out; the callback URL is the real gateway, in front of the real provisioner, inventory, NATS,
PostgreSQL and the Redfish emulator (the job is ``booting`` from its medium, with its token).
Needs root and the cached live image (``live_root``)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from karios.provisioner.install import HostContext
from karios.provisioner.install.image import ImageMethod
from tests.fixtures.apps import ADMIN
from tests.fixtures.installs import LIVE_PATH, in_live, live_root  # noqa: F401  (fixture)
from tests.fixtures.provision import medium_token, wait_job

pytestmark = [pytest.mark.integration, pytest.mark.lab]

#: An HTTP server that sends the whole Content-Length's headers but half the body, says so on
#: stdout, and waits to be killed.
SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
body = open(sys.argv[1], "rb").read()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2 + 4321])
        self.wfile.flush()
        print("HALF", flush=True)
        import time; time.sleep(600)
    def log_message(self, *a):
        pass
srv = HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.handle_request()
"""
NO_PROC = '[ ! -e /proc/self ] || { echo "refusing: /proc is mounted"; exit 99; }\n'


def _archive(path: Path) -> Path:
    if not shutil.which("zstd"):
        pytest.skip("zstd is not installed")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(6):
            data = os.urandom(1 << 20)
            info = tarfile.TarInfo(f"usr/lib/file{i}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(
        subprocess.run(["zstd", "-q", "-c"], input=buf.getvalue(), capture_output=True, check=True).stdout
    )
    return path


def _stream_script(job: str, token: str, gw: str, url: str, target: str) -> str:
    """The callbacks (job, token, gateway) and the install functions of the rendered script, then
    the base-system stage's stream."""
    ctx = HostContext(
        job_id=job,
        token=token,
        callback_base=f"{gw}/controlnode",
        hostname="stream-node",
        bmc_ip="10.99.0.1",
        os_username="karios",
        password_hash="x",
        image_url=url,
    )
    cfg = type("Cfg", (), {"cache_dir": Path("/nonexistent"), "images_dir": Path("/nonexistent")})()
    script = ImageMethod(cfg).render_install_script(ctx)
    callbacks = script[
        script.index("# -- Karios callbacks") : script.index("# Everything below goes to the log")
    ]
    functions = script[script.index("IMAGE_URL=") : script.index("# -- end of install functions")]
    main = f'mkdir -p /run {target}\nSTAGE=base-system\nstream_root "$IMAGE_URL" {target}\necho streamed\n'
    return NO_PROC + callbacks + functions + main


async def test_the_image_server_killed_mid_stream_fails_the_job_in_seconds(stack, live_root, tmp_path):  # noqa: F811
    archive = _archive(tmp_path / "root.tar.zst")
    ip = stack.bmc_ips[1]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
        r = await c.post(
            "/controlnode/provision/dell",
            json={"bmc_IP": ip, "vendor": "dell", "hostname": "stream-node"},
            headers=ADMIN,
        )
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=180)
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")

        server = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SERVER, str(archive), stdout=asyncio.subprocess.PIPE
        )
        target = f"/tmp/stream-{os.getpid()}"
        live = None
        try:
            assert server.stdout is not None
            port = int(await asyncio.wait_for(server.stdout.readline(), 30))
            url = f"http://127.0.0.1:{port}/images/bookworm/root.tar.zst"
            argv = in_live(live_root, _stream_script(job, token, stack.gw, url, target), mounts=("dev",))
            live = await asyncio.create_subprocess_exec(
                *argv,
                env={"PATH": LIVE_PATH},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            assert await asyncio.wait_for(server.stdout.readline(), 60) == b"HALF\n"
            # Mid-body: the job is still going; the server process dies.
            assert (await c.get(f"/controlnode/job/{job}", headers=ADMIN)).json()["job_status"] != "failed"
            server.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            done = await wait_job(c, job, {"failed"}, timeout=30)
            took = time.monotonic() - killed
            out, _ = await asyncio.wait_for(live.communicate(), 60)
        finally:
            if server.returncode is None:
                server.kill()
            await server.wait()
            if live is not None and live.returncode is None:
                live.kill()
                await live.wait()
            shutil.rmtree(live_root / target.lstrip("/"), ignore_errors=True)
    text = out.decode(errors="replace")
    assert live.returncode == 1 and "streamed" not in text, text
    msg = done["message"]
    print(f"failed {took:.1f} s after the kill: {msg}")
    assert took < 10, (took, msg)
    assert "base-system" in msg and "writing the root filesystem" in msg, msg
    # curl's words (the transfer cut short) first, then zstd's (the frame cut short).
    assert "curl: (18) transfer closed with " in msg or "curl: (56) " in msg, msg
    assert "zstd: /*stdin*\\ : " in msg, msg
