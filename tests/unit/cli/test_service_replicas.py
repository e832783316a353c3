"""``karios up --service-replicas SERVICE=N`` (issue 28 item 3): N processes of one service
instead of ``--replicas``; a bad value is a usage error naming the option and the services, and
``replicas.json`` lists every child's URL."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.cli.main import main
from karios.cli.services import SERVICES
from karios.cli.up import Up, parse_service_replicas


def test_parse_service_replicas():
    assert parse_service_replicas([]) == {}
    assert parse_service_replicas(["provisioner=3", " api-gateway = 2 "]) == {
        "provisioner": 3,
        "api-gateway": 2,
    }


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("foo=2", "no service 'foo'; the services are inventory, provisioner"),
        ("provisioner=x", "N must be a whole number from 1 to 9"),
        ("provisioner=0", "N must be a whole number from 1 to 9"),
        ("provisioner=10", "N must be a whole number from 1 to 9"),
        ("provisioner=-1", "N must be a whole number from 1 to 9"),
        ("provisioner", "is not SERVICE=N"),
        ("=3", "no service ''"),
    ],
)
def test_parse_service_replicas_rejects(value: str, said: str):
    with pytest.raises(ValueError, match=said):
        parse_service_replicas([value])


def test_a_service_given_twice_is_rejected():
    with pytest.raises(ValueError, match="provisioner is given twice"):
        parse_service_replicas(["provisioner=2", "provisioner=3"])


@pytest.mark.parametrize("value", ["foo=2", "provisioner=x"])
def test_a_bad_value_is_a_usage_error_naming_the_option(value: str, capsys: pytest.CaptureFixture[str]):
    # The check runs while the command line is parsed: nothing is started.
    assert main(["up", "--service-replicas", value]) == 2
    err = capsys.readouterr().err
    assert "'--service-replicas'" in err and value in err
    if value.startswith("foo"):
        assert all(name in err for name in SERVICES)


def _up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **args: object) -> Up:
    for name in list(os.environ):
        if name.startswith("KARIOS_"):
            monkeypatch.delenv(name)
    defaults = dict(timeout=5, max_crashes=3, crash_window=60, otlp_endpoint=None, cluster=0, replicas=0)
    return Up(SimpleNamespace(**(defaults | args)), tmp_path / "state")  # type: ignore[arg-type]


def test_add_services_starts_the_count_asked_of_each_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    up = _up(
        tmp_path,
        monkeypatch,
        cluster=3,  # --replicas defaults to 2
        service_replicas=parse_service_replicas(["provisioner=3", "api-gateway=2", "bootapi=1"]),
    )
    _, urls = up._add_services()  # children added, none started
    assert all(child.proc is None for child in up.sup.children.values())
    by_service = {name: sorted(c for c in urls if c == name or c.startswith(f"{name}-")) for name in SERVICES}
    assert by_service["provisioner"] == ["provisioner", "provisioner-2", "provisioner-3"]
    assert by_service["api-gateway"] == ["api-gateway", "api-gateway-2"]
    assert by_service["bootapi"] == ["bootapi"]
    assert by_service["inventory"] == ["inventory", "inventory-2"]  # --replicas (2 with --cluster)
    assert by_service["fabric-worker"] == ["fabric-worker", "fabric-worker-2"]
    assert set(up.sup.children) == set(urls) and len(set(urls.values())) == len(urls) == 10
    for child in ("provisioner-3", "api-gateway-2"):
        assert up.sup.children[child].argv[-2:] == ["run", child.rsplit("-", 1)[0]]
    assert json.loads((up.state / "replicas.json").read_text()) == urls


def test_one_service_replicated_without_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    up = _up(tmp_path, monkeypatch, service_replicas={"provisioner": 2})
    _, urls = up._add_services()
    assert sorted(urls) == sorted([*SERVICES, "provisioner-2"])
    assert json.loads((up.state / "replicas.json").read_text()) == urls  # every child, not only these


def test_no_replicas_no_replicas_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    up = _up(tmp_path, monkeypatch)
    _, urls = up._add_services()
    assert sorted(urls) == sorted(SERVICES)
    assert not (up.state / "replicas.json").exists()
