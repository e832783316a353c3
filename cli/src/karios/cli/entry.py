"""The ``karios`` command's entry point.

``karios ready <service>`` is a container health check: Docker runs it every few seconds in every
replica. Through the full CLI (Typer, the client verbs, pydantic settings) one check cost ~0.45 s
of CPU — ten replicas checked every 5 s took most of a 2-core machine (measured on the compose
topology, docs/operations.md). Here it answers with the standard library alone (~0.03 s), with
the same output and exit status; every other verb, ``--help`` and any option this parser does not
know load the full CLI (:mod:`karios.cli.main`).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

#: The port setting of each service and its default (``KariosSettings``; a unit test keeps them
#: equal). The environment overrides it as for the service itself: ``KARIOS_<SETTING>``.
READY_PORTS: dict[str, tuple[str, int]] = {
    "api-gateway": ("gateway_port", 8080),
    "bootapi": ("bootapi_port", 8081),
    "provisioner": ("provisioner_port", 8082),
    "inventory": ("inventory_port", 8083),
    "fabric-worker": ("fabric_worker_port", 8084),
}


def _ready_args(argv: list[str]) -> tuple[str, float] | None:
    """``ready SERVICE [--timeout S]`` → (service, timeout); None for anything else."""
    if len(argv) < 2 or argv[0] != "ready" or argv[1] not in READY_PORTS:
        return None
    rest, timeout = argv[2:], 2.0
    if rest:
        value = rest[1] if len(rest) == 2 and rest[0] == "--timeout" else None
        if len(rest) == 1 and rest[0].startswith("--timeout="):
            value = rest[0].split("=", 1)[1]
        try:
            timeout = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None  # the full CLI says what is wrong with it
        if not timeout > 0:
            return None
    return argv[1], timeout


def ready(service: str, timeout: float) -> int:
    """Exit status 0 if ``service`` on this host answers 200 on /readyz (prints its answer)."""
    setting, default = READY_PORTS[service]
    raw = os.environ.get(f"KARIOS_{setting.upper()}", "")
    try:
        port = int(raw) if raw.strip() else default
    except ValueError:
        print(f"{service}: not ready (KARIOS_{setting.upper()} is not a port number)")
        return 1
    ok, body = probe(f"http://127.0.0.1:{port}/readyz", timeout)
    print(f"{service}: {'ready' if ok else 'not ready'} {body}")
    return 0 if ok else 1


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """Whether a readiness URL answers 200 now, and what it said (no answer: not ready).
    Also ``karios up``'s start-up and supervisor check (:func:`karios.cli.supervisor.is_ready`)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (our own 127.0.0.1 URL)
            return r.status == 200, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace")
    except OSError as exc:
        return False, f"no answer: {exc}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if (parsed := _ready_args(args)) is not None:
        return ready(*parsed)
    from karios.cli.main import main as full

    return full(args)
