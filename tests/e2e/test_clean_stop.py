"""Issue 26: a healthy start and a Ctrl-C (SIGINT) or SIGTERM stop of ``karios up`` log no
error-level line — nothing a log-based alert would page someone for.

Two cycles on one state directory: start, one audited write (its ``audit`` line is in the
gateway's log), Ctrl-C to the process group as a terminal sends it; start again on the same
state, SIGTERM. Then every line of every service log (and ``karios.log``) is read: no
``error``/``critical`` record, no plain-text traceback, no "Application shutdown failed" (the
services stop and drain before the embedded NATS and PostgreSQL), no supervisor restart, and
each service logged "service stopped" once per cycle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.chaos import PORT_VARS, KariosUp, http_post, state_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BAD_TEXT = ("Traceback", "Application shutdown failed", "exited with code", "restarted (pid", "did not stop")


class _Up(KariosUp):
    """``karios up`` in its own process group, so the test can Ctrl-C it like a terminal does."""

    def __init__(self, state: Path) -> None:
        real = subprocess.Popen

        def own_group(*args, **kwargs):  # type: ignore[no-untyped-def]
            return real(*args, **kwargs, process_group=0)

        subprocess.Popen = own_group  # type: ignore[misc]
        try:
            super().__init__(state)
        finally:
            subprocess.Popen = real  # type: ignore[misc]

    def stop_with(self, sig: int, timeout: float = 90.0) -> int:
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)  # the whole foreground group, as Ctrl-C does
        else:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(5)
        return self.proc.returncode


class _Stream(threading.Thread):
    """One ``GET /controlnode/events`` read to its end; ``last`` is its last frame."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.req = urllib.request.Request(
            f"{url}/controlnode/events", headers={"Authorization": f"Bearer {token}"}
        )
        self.opened = threading.Event()
        self.server, self.last, self.error = "", b"", ""

    def run(self) -> None:
        try:
            with urllib.request.urlopen(self.req, timeout=120) as resp:
                self.server = resp.headers.get("server", "")
                self.opened.set()
                for line in resp:
                    if line.strip():
                        self.last = line if not line.startswith(b"data:") else self.last + line
        except Exception as exc:
            self.error = repr(exc)
            self.opened.set()


def _problems(logs: Path) -> list[str]:
    found = []
    for path in sorted(logs.glob("*.log")):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.name}:{n}: {line[:400]}"
            try:
                rec = json.loads(line)
            except ValueError:
                if any(bad in line for bad in BAD_TEXT):
                    found.append(where)
                continue
            if not isinstance(rec, dict):
                continue
            level = str(rec.get("level", "")).lower()
            text = f"{rec.get('event', '')} {rec.get('exception', '')}"
            if level in ("error", "critical", "fatal") or "Application shutdown failed" in text:
                found.append(where)
    return found


@pytest.mark.timeout(600)
def test_start_and_stop_log_no_error_line():
    with state_dir("karios-stop-") as state:
        for sig in (signal.SIGINT, signal.SIGTERM):
            up = _Up(state)
            try:
                up.wait_started(timeout=300)
                if sig == signal.SIGINT:  # one audited write: its line is in the gateway's log
                    status, body, _ = http_post(
                        f"{up.url()}/controlnode/tokens", {"name": "stop-test", "role": "viewer"}, up.token
                    )
                    assert status == 201
                    secrets = (json.loads(body)["token"], up.token)
                streams = []
                if sig == signal.SIGTERM:  # SSE streams never end by themselves: stop cuts them
                    streams = [_Stream(up.url(), up.token) for _ in range(2)]
                    for st in streams:
                        st.start()
                        assert st.opened.wait(30) and not st.error, st.error
            finally:
                began = time.monotonic()
                code = up.stop_with(sig)
            assert code == 0, up.text()
            for st in streams:
                st.join(10)
                # Served by granian (karios run's default for the gateway), which waits for open
                # responses before it stops: the relay ended each stream first, telling the
                # client where to resume.
                assert st.server == "granian" and not st.error, (st.server, st.error)
                assert st.last.startswith(b"event: reconnect") and b'"server stopping"' in st.last, st.last
            if streams:
                assert time.monotonic() - began < 30, "karios up took too long to stop with SSE streams open"
            assert "karios: stopped" in up.text(), up.text()

        logs = state / "logs"
        problems = _problems(logs)
        assert not problems, "error-level lines in a clean start/stop:\n" + "\n".join(problems)
        lines = (logs / "api-gateway.log").read_text().splitlines()
        gateway = [json.loads(x) for x in lines if x.startswith("{")]
        audit = [r for r in gateway if r.get("event") == "audit"]
        assert [(r["actor"], r["route"], r["status"], r["target"]) for r in audit] == [
            ("bootstrap-admin", "/controlnode/tokens", 201, "stop-test")
        ]
        every_line = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
        assert not [s for s in secrets if s in every_line]  # no token value in any log
        for name in PORT_VARS:
            text = (logs / f"{name}.log").read_text()
            assert text.count('"service stopped"') == 2, f"{name}: {text[-2000:]}"
