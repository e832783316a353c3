"""Readiness of a service on this host (its ``/readyz``): ``karios ready`` answers with it and
``karios up``'s start-up and supervisor check with it. Standard library only: ``karios ready`` is
a container health check that must not load the full CLI (:mod:`karios.cli.entry`)."""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request

from karios.common.instance import INSTANCE_HEADER

#: The port setting of each service and its default (``KariosSettings``; a unit test keeps them
#: equal). The environment overrides it as for the service itself: ``KARIOS_<SETTING>``.
READY_PORTS: dict[str, tuple[str, int]] = {
    "api-gateway": ("gateway_port", 8080),
    "bootapi": ("bootapi_port", 8081),
    "provisioner": ("provisioner_port", 8082),
    "inventory": ("inventory_port", 8083),
    "fabric-worker": ("fabric_worker_port", 8084),
}


def ready(service: str, timeout: float) -> int:
    """Exit status 0 if ``service`` on this host answers 200 on /readyz (prints its answer)."""
    setting, default = READY_PORTS[service]
    raw = os.environ.get(f"KARIOS_{setting.upper()}", "")
    try:
        port = int(raw) if raw.strip() else default
    except ValueError:
        print(f"{service}: not ready (KARIOS_{setting.upper()} is not a port number)")
        return 1
    tls = os.environ.get("KARIOS_TLS_CERTFILE", "").strip() and (
        service == "api-gateway"
        or (service == "provisioner" and _true(os.environ.get("KARIOS_PROVISIONER_TLS", "")))
    )
    ok, body = probe(f"{'https' if tls else 'http'}://127.0.0.1:{port}/readyz", timeout)
    print(f"{service}: {'ready' if ok else 'not ready'} {body}")
    return 0 if ok else 1


def _true(raw: str) -> bool:
    """A boolean setting as pydantic reads it from the environment."""
    return raw.strip().lower() in ("1", "true", "yes", "on", "t", "y")


def probe(url: str, timeout: float, instance: str = "") -> tuple[bool, str]:
    """Whether a readiness URL answers 200 now, and what it said (no answer: not ready).
    Also ``karios up``'s start-up and supervisor check (:func:`karios.cli.supervisor.is_ready`):
    with `instance`, only the process started with that ``KARIOS_INSTANCE_ID`` counts — a
    foreign process holding the port is not the service, whatever it answers."""
    # HTTPS (the gateway with KARIOS_TLS_CERTFILE, the provisioner with KARIOS_PROVISIONER_TLS):
    # the certificate is not checked here — the probe sends nothing secret, and its name may not
    # be this address; the instance header is what proves the answer comes from the process that
    # was started.
    tls = ssl._create_unverified_context() if url.startswith("https:") else None  # noqa: S323
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=tls) as r:  # noqa: S310 (our own URL)
            body = r.read().decode(errors="replace")
            got = r.headers.get(INSTANCE_HEADER, "")
            if instance and got != instance:
                return False, f"answered by another process (instance {got or 'none'}), not the one started"
            return r.status == 200, body
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace")
    except OSError as exc:
        return False, f"no answer: {exc}"
