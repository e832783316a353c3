"""The published contract must match the code."""

from __future__ import annotations

import json
from pathlib import Path

from karios.bootapi.app import openapi_document

REGENERATE = "uv run python -m karios.bootapi openapi -o docs/openapi/bootapi.json"
DOC = Path(__file__).resolve().parents[3] / "docs" / "openapi" / "bootapi.json"


def test_docs_openapi_bootapi_json_is_current():
    current = json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
    assert DOC.exists(), f"{DOC} missing: {REGENERATE}"
    assert DOC.read_text() == current, f"docs/openapi/bootapi.json is stale: run `{REGENERATE}`"


def test_openapi_documents_every_seed_endpoint():
    paths = openapi_document()["paths"]
    assert set(paths) >= {
        "/ipxe/{mac}",
        "/boot/ipxe",
        "/ks/{ident}",
        "/provisioned/{ident}",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert set(paths["/provisioned/{ident}"]["post"]["responses"]) >= {"204", "401", "404", "502", "503"}
