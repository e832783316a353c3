"""Readiness counts only the process ``karios up`` started (issue 24, S3): with another process
on a service's port, ``karios up`` printed "all services ready" and the supervisor logged
"api-gateway ready again" because the foreign process answered ``/readyz`` with 200."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from karios.cli.readiness import probe
from karios.cli.supervisor import Child, Supervisor
from karios.common.instance import INSTANCE_HEADER


@contextmanager
def readyz_server(instance: str | None):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            if instance is not None:
                self.send_header(INSTANCE_HEADER, instance)
            self.end_headers()
            self.wfile.write(b'{"ready": true}')

        def log_message(self, *_a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/readyz"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_foreign_process_answering_200_is_not_the_service() -> None:
    with readyz_server(None) as url:
        ok, said = probe(url, 2, instance="a1b2")
        assert not ok and said.startswith("answered by another process (instance none)")
        assert probe(url, 2)[0]  # `karios ready` (no instance to check) still reports the answer
    with readyz_server("other") as url:
        assert probe(url, 2, instance="a1b2") == (
            False,
            "answered by another process (instance other), not the one started",
        )
    with readyz_server("a1b2") as url:
        assert probe(url, 2, instance="a1b2")[0]


def test_the_supervisor_gives_each_start_its_own_instance_and_never_calls_a_foreign_answer_ready(
    tmp_path: Path,
) -> None:
    with readyz_server(None) as url:
        sup = Supervisor(env={}, log_dir=tmp_path, console=open(tmp_path / "console", "w"))  # noqa: SIM115
        child = Child(
            "api-gateway", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "gw.log", url
        )
        sup.add(child)
        sup.start_all()
        try:
            first = child.instance
            assert len(first) == 32
            child.down_since = 0.0  # as after a crash: the supervisor waits for "ready again"
            sup.poll(now=1.0)
            assert child.down_since == 0.0, "a foreign process on the port is not the service ready again"
            log = tmp_path / "karios.log"
            assert not log.exists() or "ready again" not in log.read_text()
        finally:
            assert child.proc is not None
            child.proc.kill()
            child.proc.wait()
        child.proc = None
        sup._spawn(child)  # a restart: a new instance id in its environment
        try:
            assert child.instance != first
            env = subprocess.run(
                ["cat", f"/proc/{child.proc.pid}/environ"], capture_output=True, check=True
            ).stdout.split(b"\0")
            assert f"KARIOS_INSTANCE_ID={child.instance}".encode() in env
        finally:
            child.proc.kill()
            child.proc.wait()
