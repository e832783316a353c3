"""``karios ready <service>``: the container health check answers from the standard library alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from karios.cli.entry import _ready_args
from karios.cli.readiness import READY_PORTS
from karios.cli.services import SERVICES
from karios.common.settings import KariosSettings

KARIOS = Path(sys.executable).with_name("karios")


def test_ready_ports_are_the_settings_defaults():
    assert set(READY_PORTS) == set(SERVICES)
    for name, spec in SERVICES.items():
        assert READY_PORTS[name] == (
            spec.port_setting,
            KariosSettings.model_fields[spec.port_setting].default,
        )


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        (["ready", "inventory"], ("inventory", 2.0)),
        (["ready", "bootapi", "--timeout", "0.5"], ("bootapi", 0.5)),
        (["ready", "bootapi", "--timeout=3"], ("bootapi", 3.0)),
        (["ready", "nosuch"], None),  # the full CLI names the valid choices
        (["ready", "bootapi", "--timeout", "soon"], None),
        (["ready", "bootapi", "--timeout", "-1"], None),
        (["ready", "bootapi", "--help"], None),
        (["-o", "json", "ready", "bootapi"], None),
        (["up"], None),
        ([], None),
    ],
)
def test_only_a_plain_ready_skips_the_full_cli(argv, parsed):
    assert _ready_args(argv) == parsed


class _Readyz(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = b'{"status":"ok"}' if self.status == 200 else b'{"status":"bus unavailable"}'
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def readyz() -> Iterator[tuple[ThreadingHTTPServer, type[_Readyz]]]:
    handler = type("H", (_Readyz,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, handler
    server.shutdown()


def _run(*args: str, port: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env["KARIOS_INVENTORY_PORT"] = str(port)  # no secret key set: the check must not need one
    probe = (
        "import sys; from karios.cli.entry import main; rc = main(sys.argv[1:]); "
        "heavy = sorted({'typer', 'pydantic', 'fastapi', 'karios.cli.main'} & set(sys.modules)); "
        "print('heavy:', heavy); sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_ready_and_not_ready_without_loading_the_cli(readyz):
    server, handler = readyz
    port = server.server_address[1]
    ok = _run("ready", "inventory", port=port)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ['inventory: ready {"status":"ok"}', "heavy: []"]
    handler.status = 503
    down = _run("ready", "inventory", "--timeout", "1", port=port)
    assert down.returncode == 1
    assert down.stdout.splitlines()[0] == 'inventory: not ready {"status":"bus unavailable"}'
    assert down.stdout.splitlines()[1] == "heavy: []"


def test_nothing_listening_is_not_ready_in_one_line(readyz):
    server, _ = readyz
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    r = _run("ready", "inventory", port=port)
    assert r.returncode == 1 and r.stdout.startswith("inventory: not ready no answer:")
    assert "Traceback" not in r.stderr


def test_the_installed_command_uses_it_and_other_verbs_still_work(readyz):
    server, _ = readyz
    assert KARIOS.exists(), KARIOS
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    env["KARIOS_INVENTORY_PORT"] = str(server.server_address[1])
    r = subprocess.run(
        [str(KARIOS), "ready", "inventory"], env=env, capture_output=True, text=True, timeout=30
    )
    assert (r.returncode, r.stdout.strip()) == (0, 'inventory: ready {"status":"ok"}')
    bad = subprocess.run(
        [str(KARIOS), "ready", "nosuch"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "nosuch" in bad.stderr  # the full CLI's usage error


def test_a_usage_error_is_the_usage_and_one_error_line_never_a_traceback():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KARIOS_")}
    r = subprocess.run([str(KARIOS), "provision"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "Missing argument 'BMC'" in r.stderr, r.stderr
