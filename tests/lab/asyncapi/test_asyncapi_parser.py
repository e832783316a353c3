"""docs/asyncapi.json through the reference AsyncAPI parser (``@asyncapi/parser`` from npm).

``npm ci`` installs the pinned parser (package-lock.json here) into
``${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/npm/asyncapi`` with the npm cache beside it, so a
warm machine works offline; it reinstalls only when the lock file changed. A missing node/npm
skips on a developer machine and fails under CI; a failing ``npm ci`` always fails.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from karios.common.contracts.asyncapi import INTEGRATOR, build_document
from karios.common.contracts.asyncapi_catalog import COMMAND_ROUTES, EVENT_ROUTES, EXAMPLES
from tests.fixtures.apps import REQUIRE

pytestmark = pytest.mark.lab
HERE = Path(__file__).resolve().parent
DOC = HERE.parents[2] / "docs" / "asyncapi.json"
FILES = ("package.json", "package-lock.json", "validate.mjs")


def _cache() -> Path:
    root = Path(os.environ.get("KARIOS_LAB_CACHE", "/var/cache/karios-lab")) / "npm"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return Path.home() / ".cache" / "karios-lab" / "npm"  # a developer without /var/cache rights


@pytest.fixture(scope="module")
def validator() -> Path:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        if REQUIRE:
            pytest.fail(f"{' and '.join(missing)} required in CI (tests/lab/setup.sh)", pytrace=False)
        pytest.skip(f"{' and '.join(missing)} not installed")
    cache = _cache()
    work = cache / "asyncapi"
    work.mkdir(parents=True, exist_ok=True)
    lock = (HERE / "package-lock.json").read_bytes()
    installed = work / "node_modules" / ".package-lock.json"
    stale = not installed.exists() or (work / "package-lock.json").read_bytes() != lock
    for name in FILES:
        shutil.copyfile(HERE / name, work / name)
    if stale:
        cmd = ["npm", "ci", "--cache", str(cache / "_cacache"), "--prefer-offline", "--no-audit", "--no-fund"]
        r = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"npm ci failed ({r.returncode}) in {work}:\n{r.stderr[-3000:]}", pytrace=False)
    return work


def validate(work: Path, doc: Path) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        ["node", "validate.mjs", str(doc)], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert r.stdout.strip(), f"the validator printed nothing: {r.stderr[-3000:]}"
    return r.returncode, json.loads(r.stdout)


def test_published_document_parses_without_errors_and_declares_operations(validator: Path) -> None:
    code, report = validate(validator, DOC)
    errors = [d for d in report["diagnostics"] if d["severity"] == 0]
    assert code == 0 and report["parsed"] and not errors, errors
    assert report["version"].startswith("3.")
    ops = {o["id"]: o for o in report["operations"]}
    for route in EVENT_ROUTES:
        on_channel = [o for o in ops.values() if o["channels"] == [route.channel]]
        assert {o["action"] for o in on_channel} == {"send", "receive"}, route.channel
        offered = ops[f"{INTEGRATOR}_receive_{route.channel}"]
        assert offered["action"] == "receive" and len(offered["messages"]) == len(route.messages)
    for route in COMMAND_ROUTES:
        assert {o["action"] for o in ops.values() if o["channels"] == [route.channel]} == {"send", "receive"}
    assert report["examples"] == len(EXAMPLES)


def test_a_wrong_example_or_a_dangling_reference_is_an_error(validator: Path, tmp_path: Path) -> None:
    doc = build_document()
    bad = copy.deepcopy(doc)
    example = bad["components"]["messages"]["provision_job_progress_v1"]["examples"][0]
    example["payload"]["data"]["percent"] = "forty"
    (tmp_path / "bad_example.json").write_text(json.dumps(bad))
    code, report = validate(validator, tmp_path / "bad_example.json")
    assert code == 1
    assert any(
        d["severity"] == 0 and d["code"] == "message-example-invalid" and "percent" in d["message"]
        for d in report["diagnostics"]
    ), report["diagnostics"]

    dangling = copy.deepcopy(doc)
    op = next(iter(dangling["operations"].values()))
    op["channel"] = {"$ref": "#/channels/noSuchChannel"}
    (tmp_path / "dangling.json").write_text(json.dumps(dangling))
    code, report = validate(validator, tmp_path / "dangling.json")
    assert code == 1 and any(d["severity"] == 0 for d in report["diagnostics"]), report
