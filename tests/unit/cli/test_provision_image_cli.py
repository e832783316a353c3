"""``karios provision --image NAME --disk sda``: the request names the catalog image and the disk
(sent to a recording HTTP server standing in for the gateway)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from karios.cli.entry import main


def _provision(monkeypatch, argv: list[str]) -> tuple[int, list[dict]]:
    """``karios provision ARGV`` against a recording gateway: (exit code, the request bodies)."""
    seen: list[dict] = []

    class Gateway(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"job_id": "j-1", "status": "queued", "message": "queued", "success": True})
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("KARIOS_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    monkeypatch.setenv("KARIOS_TOKEN", "t")
    try:
        rc = main(["provision", *argv])
    finally:
        srv.shutdown()
    return rc, seen


def test_provision_names_the_catalog_image_and_the_disks(monkeypatch, capsys) -> None:
    rc, seen = _provision(
        monkeypatch, ["192.0.2.11", "--image", "debian-cloud", "--disk", "sda", "--hostname", "n1"]
    )
    assert rc == 0, capsys.readouterr()
    assert seen == [
        {
            "bmc_IP": "192.0.2.11",
            "vendor": "generic",
            "debian_version": "12",
            "hostname": "n1",
            "image": "debian-cloud",
            "selected_disks": ["sda"],
        }
    ]
    assert "j-1" in capsys.readouterr().out


def test_provision_names_the_pool_and_its_backend(monkeypatch, capsys) -> None:
    argv = ["192.0.2.12", "--disk", "sda", "--disk", "sdb", "--disk", "sdc", "--pool", "raidz1"]
    rc, seen = _provision(monkeypatch, [*argv, "--pool-backend", "md"])
    assert rc == 0, capsys.readouterr()
    assert seen[0]["selected_disks"] == ["sda", "sdb", "sdc"]
    assert (seen[0]["pool_type"], seen[0]["pool_backend"]) == ("raidz1", "md")
    rc, seen = _provision(monkeypatch, argv)  # no --pool-backend: the deployment's default (ZFS)
    assert rc == 0 and "pool_backend" not in seen[0], seen
