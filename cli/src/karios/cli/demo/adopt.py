"""Adoption of the demo's lab nodes through the gateway (``karios demo --fabric``): each node with
the lab's SSH key and the fingerprint of the host key the lab made for it (the worker pins that
key, no other), then the demo's fabric configuration
(:func:`karios.cli.demo.config.demo_fabric_config`). Stdlib only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from karios.cli.demo.config import demo_fabric_config
from karios.cli.demo.lab import FabricLab


def _api(gateway: str, token: str, method: str, path: str, body: object = None) -> tuple[int, dict]:
    """One JSON call to the gateway (our own 127.0.0.1 URL): (status, body)."""
    req = urllib.request.Request(  # noqa: S310 (the demo's own gateway URL)
        gateway + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        data = {"message": raw.decode(errors="replace")[:300]}
    return status, data if isinstance(data, dict) else {"items": data}


def adopt_and_configure(lab: FabricLab, gateway: str, token: str) -> list[dict]:
    """Adopt every lab node through the gateway (``POST /controlnode/nodes`` with the lab's SSH
    key and the node's host key fingerprint: the worker pins that key, refusing any other before
    logging in) and store :func:`demo_fabric_config`.
    Returns the adopted nodes as the gateway answered them (no secrets). A refusal raises
    RuntimeError with the gateway's message; a pinned fingerprint other than the node's own key
    (someone else answered on that address) too."""
    with open(lab.client_key_path) as fh:
        key = fh.read()
    adopted = []
    for n in lab.nodes:
        body = {
            "node_ip": n.underlay_ip,
            "ssh_username": n.username,
            "ssh_private_key": key,
            "ssh_port": n.ssh_port,
            "hostname": n.name,
            # The lab made the node's host key: adopt only if that is the key answering.
            "ssh_host_key_fingerprint": n.host_key_fingerprint,
        }
        status, answer = _api(gateway, token, "POST", "/controlnode/nodes", body)
        if status != 201:
            raise RuntimeError(f"adopting {n.name} ({n.underlay_ip}): HTTP {status}: {answer.get('message')}")
        if answer.get("host_key_fingerprint") != n.host_key_fingerprint:
            raise RuntimeError(
                f"adopting {n.name} ({n.underlay_ip}): pinned host key {answer.get('host_key_fingerprint')} "
                f"is not the node's ({n.host_key_fingerprint})"
            )
        adopted.append(answer)
    status, answer = _api(gateway, token, "POST", "/controlnode/fabric-config", demo_fabric_config())
    if status not in (200, 201):
        raise RuntimeError(f"storing the fabric configuration: HTTP {status}: {answer.get('message')}")
    return adopted
