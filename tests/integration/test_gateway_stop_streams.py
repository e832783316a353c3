"""``karios run api-gateway`` stopped (SIGTERM) with SSE streams open, under either server it
offers (granian, the default; uvicorn, ``--server uvicorn``): each stream ends with
``event: reconnect`` (``"reason": "server stopping"`` and the id to resume from) and the gateway
exits well within uvicorn's 5 s grace — before, uvicorn cut the streams after that grace with
no frame (issue 28: the SIGTERM cut-off was only tested with granian)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from tests.fixtures.apps import free_port
from tests.fixtures.wait import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "kt_test-admin-token"


class _Stream(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.req = urllib.request.Request(
            f"{url}/controlnode/events", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        self.opened = threading.Event()
        self.server, self.frames, self.error = "", [], ""

    def run(self) -> None:
        try:
            with urllib.request.urlopen(self.req, timeout=60) as resp:
                self.server = resp.headers.get("server", "")
                self.opened.set()
                for line in resp:
                    self.frames.append(line)
        except Exception as exc:
            self.error = repr(exc)
            self.opened.set()


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_sigterm_ends_every_stream_with_a_reconnect_frame(settings, tmp_path: Path, server: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env.update(
        KARIOS_DEV_MODE="1",
        KARIOS_NATS_URL=settings.nats_url,
        KARIOS_DATABASE_URL=settings.database_url,
        KARIOS_BUS_PREFIX=settings.bus_prefix,
        KARIOS_BOOTSTRAP_ADMIN_TOKEN=TOKEN,
        KARIOS_LOG_JSON="false",
        KARIOS_HOST="127.0.0.1",
        KARIOS_GATEWAY_PORT=str(port),
        KARIOS_STATE_DIR=str(tmp_path / "state"),
    )
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "karios.cli", "run", "api-gateway", "--server", server],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()[-2000:]
                try:
                    return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until_sync(ready, timeout=60, interval=0.2, what=f"the gateway on {server}")
            streams = [_Stream(url) for _ in range(2)]
            for st in streams:
                st.start()
                assert st.opened.wait(30) and not st.error, st.error
            time.sleep(0.5)  # the streams are registered with the relay (their first frame is out)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            stopped_in = time.monotonic() - began
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # uvicorn re-raises the signal once it has shut down cleanly (exit by SIGTERM); granian exits 0
    assert code in ((0, -signal.SIGTERM) if server == "uvicorn" else (0,)), log_path.read_text()[-2000:]
    assert "service stopped" in log_path.read_text()
    for st in streams:
        st.join(10)
        assert st.server.lower().startswith(server), st.server
        text = b"".join(st.frames)
        assert b"event: reconnect" in text and b'"server stopping"' in text, (server, text[-400:], st.error)
    assert stopped_in < 4.0, (
        f"{server} took {stopped_in:.1f} s to stop with 2 streams open (its grace is 5 s)"
    )
