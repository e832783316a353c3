"""KARIOS_PROVISIONER_BMC_ENDPOINTS_FILE: per-BMC overrides from a JSON file (a fleet's map does
not fit in one environment variable), merged under KARIOS_PROVISIONER_BMC_ENDPOINTS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from karios.provisioner.config import ProvisionerConfig


def test_the_file_fills_the_map_and_the_variable_wins(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url = "http://127.0.0.1:8000"
    big = {f"10.0.{i // 256}.{i % 256}": {"url": url, "system_id": f"s{i}"} for i in range(10_000)}
    big["10.0.0.5"]["tls"] = "insecure"
    path = tmp_path / "bmcs.json"
    path.write_text(json.dumps(big))
    assert path.stat().st_size > 128 * 1024  # more than one environment variable can hold
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_ENDPOINTS_FILE", str(path))
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_ENDPOINTS", json.dumps({"10.0.0.6": {"url": "http://bmc6"}}))
    cfg = ProvisionerConfig()
    assert len(cfg.bmc_endpoints) == 10_000
    assert cfg.bmc_endpoints["10.0.39.15"] == {"url": "http://127.0.0.1:8000", "system_id": "s9999"}
    assert cfg.bmc_endpoints["10.0.0.6"] == {"url": "http://bmc6"}  # the variable's entry wins
    assert cfg.bmc_endpoints["10.0.0.5"]["tls"] == "insecure"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot be read (No such file or directory)"),
        ("{not json", "not JSON"),
        ('["10.0.0.5"]', "not an object of BMC address"),
        ('{"10.0.0.5": {"tls": "maybe"}}', "[10.0.0.5].tls: 'maybe' is not one of ca, tofu, insecure"),
    ],
)
def test_a_bad_file_is_a_start_up_error_naming_it(tmp_path: Path, monkeypatch, content, said) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bmcs.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_ENDPOINTS_FILE", str(path))
    with pytest.raises(ValidationError) as exc:
        ProvisionerConfig()
    assert f"bmc_endpoints_file {path}" in str(exc.value) and said in str(exc.value)


def test_unset_or_empty_means_no_file(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_ENDPOINTS_FILE", "")
    assert ProvisionerConfig().bmc_endpoints_file is None
