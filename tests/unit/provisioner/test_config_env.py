"""The documented variables for the default BMC credentials are the ones read (an alias replaces
pydantic-settings' env prefix, so an unprefixed alias was read from BMC_USER instead)."""

from __future__ import annotations

from karios.provisioner.config import ProvisionerConfig


def test_default_bmc_credentials_come_from_the_prefixed_variables(monkeypatch):
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_USER", "alice")
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_PASSWORD", "pw-1")
    monkeypatch.setenv("BMC_USER", "not-this")
    cfg = ProvisionerConfig()
    assert cfg.bmc_default_user == "alice" and cfg.bmc_default_password == "pw-1"
    assert "pw-1" not in repr(cfg)


def test_the_long_names_and_the_field_names_work_too(monkeypatch):
    monkeypatch.setenv("KARIOS_PROVISIONER_BMC_DEFAULT_USER", "bob")
    assert ProvisionerConfig().bmc_default_user == "bob"
    assert ProvisionerConfig(bmc_default_user="carol").bmc_default_user == "carol"
