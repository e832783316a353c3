"""The gateway's REST API for the CLI: one place that turns transport and HTTP errors into a
sentence a person can act on (no stack traces), with the exit code to leave with."""

from __future__ import annotations

import os
import ssl
from typing import Any

import httpx

from karios.cli.client.context import ClientContext
from karios.cli.client.errors import CliError

__all__ = ["Api", "CliError"]


def _json_body(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300] or resp.reason_phrase
    if isinstance(body, dict):
        msg = body.get("message") or body.get("detail") or ""
        if isinstance(msg, list):  # FastAPI-style validation list
            msg = "; ".join(str(e.get("msg", e)) for e in msg if isinstance(e, dict))
        code = body.get("code")
        return f"{msg} ({code})" if code and msg else str(msg or body)[:300]
    return str(body)[:300]


def tls_verify() -> ssl.SSLContext | bool:
    """How an https gateway URL is verified: against ``KARIOS_TLS_CA_BUNDLE`` when set (a private
    CA or the gateway's self-signed certificate), else the system's trust store."""
    ca = os.environ.get("KARIOS_TLS_CA_BUNDLE", "").strip()
    if not ca:
        return True
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(
            f"KARIOS_TLS_CA_BUNDLE {ca}: not a readable PEM file of CA certificates ({exc})", 2
        ) from None


class Api:
    def __init__(self, ctx: ClientContext, *, timeout: float = 30.0) -> None:
        if not ctx.url:
            raise CliError(
                "no gateway configured: start one with `karios up`, or `karios login URL --token …`", 2
            )
        self.ctx = ctx
        headers = {"Accept": "application/json"}
        if ctx.token:
            headers["Authorization"] = f"Bearer {ctx.token}"
        self.client = httpx.Client(base_url=ctx.url, headers=headers, timeout=timeout, verify=tls_verify())

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self, resp: httpx.Response, method: str, path: str) -> Any:
        if resp.status_code < 400:
            return resp.json() if resp.content else None
        msg = _error_message(resp)
        if resp.status_code == 401:
            raise CliError(
                f"the gateway at {self.ctx.url} rejected the token ({msg}); "
                f"log in again: karios login {self.ctx.url} --token …",
                3,
            )
        if resp.status_code == 403:
            raise CliError(f"not allowed: {method} {path}: {msg}", 3)
        if resp.status_code == 503:
            retry = resp.headers.get("Retry-After")
            raise CliError(f"unavailable ({msg}){f'; retry in {retry} s' if retry else ''}", 4)
        raise CliError(
            f"{method} {path} answered {resp.status_code}: {msg}",
            status=resp.status_code,
            body=_json_body(resp),
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.client.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the gateway at {self.ctx.url} ({exc}); is `karios up` running, "
                "or is the URL wrong (`karios login URL`)?",
                2,
            ) from None
        except httpx.TimeoutException:
            raise CliError(
                f"the gateway at {self.ctx.url} did not answer {method} {path} in time", 2
            ) from None
        except httpx.HTTPError as exc:
            raise CliError(f"{method} {path} failed: {exc}", 2) from None
        return self.check(resp, method, path)

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.call("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.call("DELETE", path, **kw)
