"""``install_error_handlers``: what the framework raises answers ``ErrorResponse`` (issue 24 D9);
a redirect raised as an ``HTTPException`` (the console's login) stays a redirect."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from karios.common.http import install_error_handlers


def _client() -> TestClient:
    app = FastAPI()

    @app.get("/things")
    async def things() -> list[int]:
        return []

    @app.post("/things")
    async def add(body: dict[str, int]) -> dict[str, int]:
        return body

    @app.api_route("/thing", methods=["GET", "HEAD"])
    async def thing() -> int:
        return 1

    @app.get("/login-first")
    async def login_first() -> None:
        raise HTTPException(status_code=303, detail="log in first", headers={"Location": "/login"})

    @app.get("/teapot")
    async def teapot() -> None:
        raise HTTPException(status_code=418, detail="short and stout")

    install_error_handlers(app)
    return TestClient(app)


def test_every_framework_error_has_a_code() -> None:
    c = _client()
    r = c.get("/nope")
    assert (r.status_code, r.json()["code"], r.json()["message"]) == (404, "NOT_FOUND", "no such path: /nope")
    for method, path, allow in [("OPTIONS", "/things", "GET, POST"), ("DELETE", "/thing", "GET, HEAD")]:
        r = c.request(method, path)
        assert (r.status_code, r.headers["allow"], r.json()["code"]) == (405, allow, "METHOD_NOT_ALLOWED")
        assert r.json()["retryable"] is False
    r = c.post("/things", content=b'{"a": "\xff"}', headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["code"]) == (400, "BAD_REQUEST")
    r = c.get("/teapot")
    assert (r.status_code, r.json()["code"], r.json()["message"]) == (418, "HTTP_418", "short and stout")


def test_a_redirect_stays_a_redirect() -> None:
    r = _client().get("/login-first", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/login")
