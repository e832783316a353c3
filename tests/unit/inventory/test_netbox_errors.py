"""pynetbox/requests failures become Karios errors once, with clear messages and no token."""

from __future__ import annotations

import pytest
import requests
from pynetbox.core.query import ContentError, RequestError

from karios.common.errors import Forbidden, NotFound, UpstreamError
from karios.inventory.netbox_store import NetBoxStore, translate_error

URL = "http://netbox.example:8000/"


def request_error(status: int, body: str = '{"detail": "nope"}') -> RequestError:
    resp = requests.Response()
    resp.status_code = status
    resp.reason = "X"
    resp._content = body.encode()
    resp.url = URL + "api/dcim/devices/1/"
    resp.request = requests.Request(
        "PATCH", resp.url, headers={"Authorization": "Bearer nbt_abc.SECRET"}
    ).prepare()
    return RequestError(resp)


def test_a_write_refused_for_permission_says_the_token_needs_write_scope():
    err = translate_error(request_error(403), "set pxe_enabled=false on device 'n1'", url=URL, write=True)
    assert isinstance(err, Forbidden) and err.http_status == 403 and not err.retryable
    assert "no write permission" in err.message and "pxe_enabled" in err.message
    assert "SECRET" not in err.message


def test_a_read_refused_is_a_502_about_the_token():
    err = translate_error(request_error(403), "look up MAC x", url=URL)
    assert isinstance(err, UpstreamError) and err.http_status == 502
    assert "refused the token" in err.message and "KARIOS_NETBOX_TOKEN" in err.message


@pytest.mark.parametrize(
    ("exc", "kind", "text"),
    [
        (request_error(500, "<html>boom</html>"), UpstreamError, "answered 500"),
        (request_error(404), NotFound, "no such object"),
        (
            requests.ConnectionError("refused"),
            UpstreamError,
            "cannot reach NetBox at http://netbox.example:8000",
        ),
        (requests.ReadTimeout("slow"), UpstreamError, "did not answer in time"),
        (RuntimeError("weird"), UpstreamError, "RuntimeError"),
    ],
)
def test_failures_map_to_karios_errors(exc, kind, text):
    err = translate_error(exc, "look up MAC x", url=URL)
    assert isinstance(err, kind) and text in err.message


def test_non_json_answer_is_a_502():
    resp = requests.Response()
    resp.status_code = 200
    resp._content = b"<html>login</html>"
    resp.url = URL
    resp.request = requests.Request("GET", URL).prepare()
    err = translate_error(ContentError(resp), "look up MAC x", url=URL)
    assert isinstance(err, UpstreamError) and "not JSON" in err.message


async def test_netbox_unreachable_is_an_upstream_error_naming_the_host_only():
    store = NetBoxStore("http://user:pw@127.0.0.1:9/", "nbt_key.TOKENVALUE", timeout=2)
    with pytest.raises(UpstreamError) as err:
        await store.host_by_mac("aa:bb:cc:dd:ee:ff")
    assert "cannot reach NetBox at http://127.0.0.1:9" in err.value.message
    assert "pw" not in err.value.message and "TOKENVALUE" not in err.value.message
    assert await store.ping() is False
