"""Answering a query: validate the payload, run the handler, turn the outcome into a :class:`Reply`.

Pure apart from the handler call, so the reply mapping (a field-naming 422, a remote
:class:`KariosError`, an opaque ``INTERNAL``) is the same for every responder.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from karios.common.contracts.base import Contract, ErrorBody, Reply
from karios.common.db.session import unavailable_database_error
from karios.common.errors import KariosError, ValidationFailed, describe_for_log, public_error
from karios.common.telemetry import get_logger

log = get_logger(__name__)

QueryHandler = Callable[[Any], Awaitable[BaseModel | dict[str, Any] | list[Any] | None]]


def _jsonable(result: Any) -> Any:
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    if isinstance(result, list):
        return [r.model_dump(mode="json") if isinstance(r, BaseModel) else r for r in result]
    return result


async def answer_query(data: bytes | None, model: type[Contract], handler: QueryHandler) -> Reply:
    """The reply to one query message (an envelope, or a bare payload for older callers)."""
    try:
        body = json.loads(data or b"{}")
        payload = model.model_validate(body.get("data", body))
        return Reply(ok=True, result=_jsonable(await handler(payload)))
    except ValidationError as exc:
        first = exc.errors()[0]
        field_name = ".".join(str(p) for p in first.get("loc", ()))
        failed = ValidationFailed(f"{field_name}: {first.get('msg')}", field=field_name)
        return Reply(ok=False, error=ErrorBody.of(failed))
    except KariosError as exc:
        return Reply(ok=False, error=ErrorBody.of(exc))
    except Exception as exc:
        # A stalled or unreachable database is the asker's 503 (retry), as on the HTTP path: a bare
        # TimeoutError in a handler during a PostgreSQL stall used to answer 500 (issue 24 D1).
        unavailable = unavailable_database_error(exc)
        if unavailable is not None:
            # A full disk (STORAGE_FULL) is the asker's 503 too, with a longer Retry-After.
            what = "storage full" if unavailable.code == "STORAGE_FULL" else "database unavailable"
            log.warning(f"query handler: {what}", query=model.TYPE, cause=describe_for_log(exc))
            return Reply(ok=False, error=ErrorBody.of(unavailable))
        # The asker sees an opaque INTERNAL; the redacted cause stays in this service's log.
        log.error("query handler failed", query=model.TYPE, cause=describe_for_log(exc))
        return Reply(ok=False, error=ErrorBody.of(public_error(exc)))
