"""Signed media URLs (issue 24, S2): the HMAC over path + job id + expiry, its verification
(constant-time, every key of the ring), expiry, and the job-state gate in front of the medium."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import pytest

from karios.common.crypto import SecretBox
from karios.provisioner.media.access import MEDIA_STATES, MediaAccess
from karios.provisioner.media.signing import (
    EXPIRES,
    SIGNATURE,
    MediaJobEnded,
    MediaUrlExpired,
    MediaUrlInvalid,
    MediaUrlSigner,
)
from karios.provisioner.statemachine import State

K1, K2 = b"1" * 32, b"2" * 32
NOW = 1_800_000_000.0


def signer(keys: dict[str, bytes] | None = None, active: str = "k1") -> MediaUrlSigner:
    return MediaUrlSigner.from_box(SecretBox(keys or {"k1": K1}, active))


def params(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    q = parse_qs(parts.query, strict_parsing=True)
    return parts.path, q[EXPIRES][0], q[SIGNATURE][0]


def test_a_signed_url_verifies_until_it_expires():
    s = signer()
    url = s.url("http://10.0.0.1:8082/", "job-1", int(NOW) + 600)
    path, exp, sig = params(url)
    assert url.startswith("http://10.0.0.1:8082/media/job-1.iso?")
    assert path == "/media/job-1.iso" and exp == str(int(NOW) + 600) and len(sig) == 43
    assert s.verify("job-1", exp, sig, now=NOW) == int(NOW) + 600
    with pytest.raises(MediaUrlExpired) as err:
        s.verify("job-1", exp, sig, now=NOW + 600)
    assert err.value.http_status == 403 and err.value.code == "MEDIA_URL_EXPIRED"


@pytest.mark.parametrize(
    "tamper",
    ["missing", "no-expiry", "other-job", "longer-expiry", "flipped-bit", "padded", "unicode-digits", "huge"],
)
def test_anything_but_the_signed_values_is_refused(tamper: str):
    s = signer()
    _, exp, sig = params(s.url("http://p", "job-1", int(NOW) + 600))
    job = "job-1"
    if tamper == "missing":
        sig = None  # type: ignore[assignment]
    elif tamper == "no-expiry":
        exp = ""
    elif tamper == "other-job":
        job = "job-2"
    elif tamper == "longer-expiry":
        exp = str(int(exp) + 3600)
    elif tamper == "flipped-bit":
        raw = bytearray(base64.urlsafe_b64decode(sig + "="))
        raw[0] ^= 1
        sig = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    elif tamper == "padded":
        sig += "="
    elif tamper == "unicode-digits":
        exp = "²" + exp[1:]
    elif tamper == "huge":
        exp = "9" * 5000
    with pytest.raises(MediaUrlInvalid) as err:
        s.verify(job, exp, sig, now=NOW)
    assert err.value.http_status == 403 and err.value.code == "MEDIA_URL_INVALID"
    assert not sig or sig not in err.value.message  # nothing presented is echoed


def test_the_key_is_derived_per_purpose_and_rotation_keeps_old_urls():
    old = signer({"k1": K1})
    _, exp, sig = params(old.url("http://p", "job-1", int(NOW) + 60))
    rotated = signer({"k1": K1, "k2": K2}, active="k2")
    assert rotated.verify("job-1", exp, sig, now=NOW)  # signed before the rotation
    _, _, new_sig = params(rotated.url("http://p", "job-1", int(NOW) + 60))
    assert new_sig != sig
    with pytest.raises(MediaUrlInvalid):
        signer({"k9": K2}, active="k9").verify("job-1", exp, sig, now=NOW)  # another deployment's key
    # The MAC key is not the encryption key itself, and it stays out of reprs.
    assert old.keys["k1"] != K1 and "keys" not in repr(old)


async def test_access_checks_the_signature_before_the_job_state():
    states = {"job-1": "booting"}
    loads: list[str] = []

    async def state_of(job_id: str) -> str | None:
        loads.append(job_id)
        return states.get(job_id)

    access = MediaAccess(signer(), state_of, clock=lambda: NOW)
    _, exp, sig = params(access.url("http://p", "job-1", 1800))
    assert int(exp) == NOW + 1800
    with pytest.raises(MediaUrlInvalid):
        await access.admit("job-1", exp, "A" * 43)
    assert loads == []  # an unsigned request never reaches the database
    await access.admit("job-1", exp, sig)
    await access.admit("job-1", exp, sig)
    assert loads == ["job-1"]  # cached: a BMC reads its medium in many ranges
    states["job-1"] = "cancelled"
    access.forget("job-1")
    with pytest.raises(MediaJobEnded) as err:
        await access.admit("job-1", exp, sig)
    assert err.value.http_status == 403 and err.value.code == "MEDIA_JOB_ENDED"
    _, exp2, sig2 = params(access.url("http://p", "gone", 1800))
    with pytest.raises(MediaJobEnded):
        await access.admit("gone", exp2, sig2)  # no such job


def test_media_states_are_the_ones_between_build_and_end():
    assert {s for s in State if s in MEDIA_STATES} == {
        State.building_media,
        State.mounting,
        State.booting,
        State.installing,
        State.first_boot,
        State.stuck,
    }
