"""The published OpenAPI documents must match the code (regenerate with the command in the message)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from karios.common.settings import KariosSettings

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("module", "path", "cmd"),
    [
        (
            "karios.api_gateway.app",
            "docs/openapi/gateway.json",
            "uv run karios openapi api-gateway > docs/openapi/gateway.json",
        ),
    ],
)
def test_published_openapi_is_current(module, path, cmd):
    create_app = __import__(module, fromlist=["create_app"]).create_app
    current = create_app(KariosSettings(dev_mode=True)).openapi()
    published = json.loads((ROOT / path).read_text())
    assert published == json.loads(json.dumps(current)), f"{path} is stale: run `{cmd}`"


def test_published_asyncapi_is_current():
    from karios.common.contracts.asyncapi import build_document

    current = json.loads(json.dumps(build_document()))
    published = json.loads((ROOT / "docs/asyncapi.json").read_text())
    assert published == current, (
        "docs/asyncapi.json is stale: run `uv run karios asyncapi > docs/asyncapi.json`"
    )
    assert len(current["components"]["messages"]) >= 30


def test_configuration_doc_is_current():
    from karios.cli.configdoc import render

    published = (ROOT / "docs/configuration.md").read_text()
    assert published == render(), (
        "docs/configuration.md is stale: run `uv run karios config-doc > docs/configuration.md`"
    )
