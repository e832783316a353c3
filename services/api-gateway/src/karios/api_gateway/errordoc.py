"""The gateway's OpenAPI document tells the truth about errors (issue 12 item 7).

Every 4xx/5xx answer of the gateway is :class:`karios.common.http.ErrorResponse` (the error
handlers of ``karios.common.http`` build them all), so every documented 4xx/5xx response names it,
and the answers any operation can give are listed once here instead of on every route:

- 401/403 on operations that need an operator token (they carry ``security``);
- 422 where a parameter or body is validated, 413 where there is a body (the size limit);
- 503 everywhere under ``/controlnode`` (bus or database unavailable; ``Retry-After`` says when).

Routes still document their own cases (404, 409, …) with their own descriptions.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from karios.common.http import ErrorResponse

REF = "#/components/schemas/ErrorResponse"
_CONTENT = {"application/json": {"schema": {"$ref": REF}}}
_DEFAULTS = {
    "401": "Missing or invalid token",
    "403": "The token's role may not do this",
    "413": "Request body larger than the limit",
    "422": "Invalid field (named in `field`)",
    "503": "A service the gateway needs is unavailable; retry after `Retry-After` seconds",
}
_METHODS = {"get", "put", "post", "delete", "patch"}


def _expected(path: str, op: dict[str, Any]) -> list[str]:
    codes = []
    if op.get("security"):
        codes += ["401", "403"]
    if op.get("parameters") or op.get("requestBody"):
        codes.append("422")
    if op.get("requestBody"):
        codes.append("413")
    if path.startswith("/controlnode"):
        codes.append("503")
    return codes


def add_error_responses(doc: dict[str, Any]) -> dict[str, Any]:
    """Give every 4xx/5xx response of ``doc`` the ErrorResponse body and add the common ones
    (idempotent: a response that already has a body or a description keeps it)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    if "ErrorResponse" not in schemas:
        error = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(error.pop("$defs", {}))
        schemas["ErrorResponse"] = error
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            if method not in _METHODS:
                continue
            responses = op.setdefault("responses", {})
            for code in _expected(path, op):
                responses.setdefault(code, {"description": _DEFAULTS[code]})
            for code, response in responses.items():
                if code[:1] in ("4", "5"):
                    response.setdefault("content", _CONTENT)
            op["responses"] = dict(sorted(responses.items()))
    return doc


def document_errors(app: FastAPI) -> None:
    """Wrap ``app.openapi`` (already the shared one that names ErrorResponse for 422)."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        return add_error_responses(base())

    app.openapi = openapi  # type: ignore[method-assign]
