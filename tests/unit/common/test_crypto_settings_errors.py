from __future__ import annotations

import base64
import os

import pytest
from pydantic import ValidationError

from karios.common.channels import channel_matches, route_event
from karios.common.crypto import SecretBox, SecretDecryptError
from karios.common.errors import (
    Disposition,
    NotFound,
    PermanentFailure,
    UpstreamError,
    ValidationFailed,
    bus_disposition,
    error_from_dict,
    http_status_for,
)
from karios.common.netaddr import normalize_mac
from karios.common.settings import DEV_SECRET_KEY, KariosSettings
from karios.common.telemetry import redact

K1, K2 = os.urandom(32), os.urandom(32)


def test_secretbox_round_trip_and_ciphertext_hides_plaintext():
    box = SecretBox({"k1": K1}, "k1")
    ct = box.encrypt("hunter2", context="bmc:10.0.0.1")
    assert "hunter2" not in ct and ct.startswith("v1:k1:")
    assert box.decrypt(ct, context="bmc:10.0.0.1") == "hunter2"
    assert box.encrypt("hunter2") != box.encrypt("hunter2")  # fresh nonce each time


def test_secretbox_context_binds_ciphertext_to_its_owner():
    box = SecretBox({"k1": K1}, "k1")
    ct = box.encrypt("pw", context="bmc:10.0.0.1")
    with pytest.raises(SecretDecryptError):
        box.decrypt(ct, context="bmc:10.0.0.2")


def test_secretbox_rotation_old_key_still_decrypts_new_writes_use_new_key():
    old = SecretBox({"k1": K1}, "k1").encrypt("pw")
    rotated = SecretBox({"k1": K1, "k2": K2}, "k2")
    assert rotated.decrypt(old) == "pw"
    assert rotated.needs_rotation(old)
    assert rotated.key_id_of(rotated.encrypt("pw")) == "k2"


def test_secretbox_tampering_and_unknown_key_are_errors_without_plaintext():
    box = SecretBox({"k1": K1}, "k1")
    ct = box.encrypt("pw")
    tampered = ct[:-4] + ("AAAA" if not ct.endswith("AAAA") else "BBBB")
    with pytest.raises(SecretDecryptError):
        box.decrypt(tampered)
    with pytest.raises(SecretDecryptError, match="unknown key id"):
        SecretBox({"k9": K2}, "k9").decrypt(ct)


def test_settings_refuse_dev_key_outside_dev_mode(monkeypatch):
    monkeypatch.delenv("KARIOS_SECRET_KEY", raising=False)
    monkeypatch.delenv("KARIOS_DEV_MODE", raising=False)
    with pytest.raises(ValidationError, match="development key"):
        KariosSettings()
    assert KariosSettings(dev_mode=True).secret_key.get_secret_value() == DEV_SECRET_KEY


def test_settings_read_env_prefix_and_validate_key_length(monkeypatch):
    monkeypatch.setenv("KARIOS_SECRET_KEY", base64.b64encode(K1).decode())
    monkeypatch.setenv("KARIOS_NATS_URL", "nats://10.9.9.9:4222")
    s = KariosSettings()
    assert s.nats_url == "nats://10.9.9.9:4222" and s.keyring["k1"] == K1
    monkeypatch.setenv("KARIOS_SECRET_KEY", base64.b64encode(b"short").decode())
    with pytest.raises(ValidationError, match="32 bytes"):
        KariosSettings()


def test_error_mapping_http_and_bus():
    assert http_status_for(ValidationFailed("x")) == 422
    assert http_status_for(NotFound("x")) == 404
    assert http_status_for(UpstreamError("x")) == 502
    assert bus_disposition(None, delivered=1, max_deliver=3) is Disposition.ACK
    assert bus_disposition(UpstreamError("x"), delivered=1, max_deliver=3) is Disposition.NAK
    assert bus_disposition(UpstreamError("x"), delivered=3, max_deliver=3) is Disposition.TERM
    assert bus_disposition(PermanentFailure("x"), delivered=1, max_deliver=3) is Disposition.TERM
    assert bus_disposition(RuntimeError("bug"), delivered=1, max_deliver=3) is Disposition.NAK


def test_errors_round_trip_through_dicts():
    err = error_from_dict(ValidationFailed("bmc_ip: bad", field="bmc_ip").to_dict())
    assert isinstance(err, ValidationFailed) and err.field == "bmc_ip"
    unknown = error_from_dict({"code": "SOMETHING_NEW", "message": "m"})
    assert unknown.code == "SOMETHING_NEW" and http_status_for(unknown) == 500


def test_redact_masks_secret_keys_recursively():
    out = redact(
        {"bmc_password": "x", "nested": [{"token": "t", "name": "n"}], "ospf_auth_key": "k", "os_ip": "1"}
    )
    assert out == {
        "bmc_password": "***",
        "nested": [{"token": "***", "name": "n"}],
        "ospf_auth_key": "***",
        "os_ip": "1",
    }


@pytest.mark.parametrize("raw", ["AA:BB:CC:DD:EE:FF", "aa-bb-cc-dd-ee-ff", "aabb.ccdd.eeff", "AABBCCDDEEFF"])
def test_mac_notations_normalise(raw):
    assert normalize_mac(raw) == "aa:bb:cc:dd:ee:ff"


def test_event_routing_to_channels():
    name, ch = route_event("provision", "progress", {"job_id": "j1", "bmc_ip": "10.0.0.1"})
    assert ch == {"provision", "job:j1", "node:10.0.0.1"} and name == "progress"
    name, ch = route_event("fabric", "node.applied", {"node_ip": "10.1.0.1"})
    assert name == "fabric_switch" and ch == {"fabric", "node:10.1.0.1"}
    assert (
        channel_matches(None, ch)
        and channel_matches({"fabric"}, ch)
        and not channel_matches({"provision"}, ch)
    )
