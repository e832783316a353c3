"""An error code only the answering service defines keeps its status and retryability across the
bus (found by the secrets-scan run: a worker's NODE_UNREACHABLE reached the user as a 500)."""

from __future__ import annotations

import json

from karios.common.bus.replies import answer_query
from karios.common.contracts.base import Query
from karios.common.errors import UpstreamError, error_from_dict, http_status_for


class _Unknown(UpstreamError):  # never registered: the asking service does not know the class
    code = "ONLY_THE_WORKER_KNOWS"


class _Q(Query):
    TYPE = "karios.test.q.v1"


async def _fails(_q: _Q) -> None:
    raise _Unknown("10.0.0.1 port 22: refused")


async def test_unknown_remote_code_keeps_status_and_retryable():
    reply = await answer_query(json.dumps({"data": {}}).encode(), _Q, _fails)
    assert reply.error is not None
    err = error_from_dict(reply.error.model_dump())
    assert (err.code, http_status_for(err), err.retryable) == ("ONLY_THE_WORKER_KNOWS", 502, True)
    assert "http_status" not in err.to_dict()  # the HTTP error body is unchanged


def test_a_bad_status_from_the_wire_is_ignored():
    err = error_from_dict({"code": "WHATEVER", "message": "m", "http_status": 200})
    assert http_status_for(err) == 500


async def _stalls(_q: _Q) -> None:
    raise TimeoutError  # what a query handler saw during a PostgreSQL stall (issue 24 D1)


async def _bug(_q: _Q) -> None:
    raise KeyError("x")


async def test_a_database_stall_in_a_query_handler_is_a_503_not_a_500():
    reply = await answer_query(json.dumps({"data": {}}).encode(), _Q, _stalls)
    assert reply.error is not None
    err = error_from_dict(reply.error.model_dump())
    assert (err.code, http_status_for(err), err.retryable) == ("SERVICE_UNAVAILABLE", 503, True)
    bug = error_from_dict((await answer_query(b"{}", _Q, _bug)).error.model_dump())
    assert (bug.code, http_status_for(bug)) == ("INTERNAL", 500)  # a real bug stays a 500
