"""The console's cookie auth against a real gateway (NATS + PostgreSQL): login sets an HttpOnly
SameSite=Strict cookie; pages need it; the REST API takes it only same-origin, and on a write
only with ``X-Karios-Console: 1``; Bearer auth is unchanged; a viewer's pages have no write
control; logout clears the cookie."""

from __future__ import annotations

import re

import httpx

from karios.api_gateway.app import create_app as gateway_app
from karios.api_gateway.auth import Role, create_token

ADMIN_TOKEN = "kt_test-admin-token"
VIEWER_TOKEN = "kt_test-console-viewer"
WRITE = {"X-Karios-Console": "1"}
#: The only buttons a viewer gets: log out, and the search forms' (GET) submit buttons.
READ_ONLY_BUTTONS = r'id="(logout|jobs-filter-go|srv-filter)"'


async def login(c: httpx.AsyncClient, token: str) -> httpx.Response:
    return await c.post(
        "/console/login", data={"token": token}, headers={"Origin": str(c.base_url).rstrip("/")}
    )


async def test_cookie_login_same_origin_rules_and_roles(settings, serve):
    gw = await serve(gateway_app(settings))
    await create_token(gw.app.state.runtime.db, "console-viewer", Role.viewer, VIEWER_TOKEN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        js = await c.get("/console/static/console.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert (await c.get("/console/static/pages.py")).status_code == 404  # only the listed files

        # Not logged in: pages redirect to the login page; the API still wants a token.
        r = await c.get("/console/jobs")
        assert r.status_code == 303 and r.headers["location"] == "/console/login?next=%2Fconsole%2Fjobs"
        assert (await c.get("/controlnode/provision/queue")).status_code == 401

        bad = await login(c, "kt_wrong")
        assert bad.status_code == 401 and "rejected" in bad.text and "kt_wrong" not in bad.text
        assert "karios_console" not in c.cookies
        empty = await login(c, "")
        assert empty.status_code == 422 and "token:" in empty.text
        cross = await c.post(
            "/console/login", data={"token": ADMIN_TOKEN}, headers={"Origin": "https://evil.example"}
        )
        assert cross.status_code == 403 and "karios_console" not in c.cookies

        r = await login(c, ADMIN_TOKEN)
        assert r.status_code == 303 and r.headers["location"] == "/console/jobs"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain http here; https requests get Secure

        page = await c.get("/console/jobs")
        assert page.status_code == 200 and 'id="provision-form"' in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for path in ("/console/nodes", "/console/fabric", "/console/jobs/live", "/console/fabric/live"):
            assert (await c.get(path)).status_code == 200, path
        assert "No job nope" in (await c.get("/console/jobs/nope")).text  # a "not found" page, no 500
        assert (await c.get("/console/jobs/nope/live")).status_code == 404

        # The cookie on the REST API: reads yes, same-origin; writes only with the console header.
        assert (await c.get("/controlnode/tokens/self")).json()["name"] == "bootstrap-admin"
        assert (
            await c.get("/controlnode/tokens/self", headers={"Sec-Fetch-Site": "cross-site"})
        ).status_code == 401
        body = {"bmc_IP": "10.9.9.9", "vendor": "generic"}
        no_header = await c.post("/controlnode/provision", json=body)
        assert no_header.status_code == 401 and "X-Karios-Console" in no_header.json()["message"]
        other_origin = await c.post(
            "/controlnode/provision", json=body, headers={**WRITE, "Origin": "http://evil.example"}
        )
        assert other_origin.status_code == 401
        same = await c.post("/controlnode/provision", json=body, headers={**WRITE, "Origin": gw.url})
        assert same.status_code not in (401, 403), same.text  # authenticated (404: BMC not in inventory)

        # Bearer unchanged, and it wins over the cookie.
        r = await c.get("/controlnode/tokens/self", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
        assert r.json()["role"] == "viewer"

        out = await c.post("/console/logout", headers={"Origin": gw.url})
        assert out.status_code == 303 and 'karios_console=""' in out.headers["set-cookie"]
        assert (await c.get("/console/jobs")).status_code == 303

        # A viewer: no write control is rendered at all, and the API refuses a write anyway.
        await login(c, VIEWER_TOKEN)
        for path in ("/console/jobs", "/console/fabric", "/console/nodes"):
            text = (await c.get(path)).text
            buttons = re.findall(r"<button[^>]*>", text)
            assert "data-write" not in text and all(re.search(READ_ONLY_BUTTONS, b) for b in buttons), path
        denied = await c.post("/controlnode/provision", json=body, headers={**WRITE, "Origin": gw.url})
        assert denied.status_code == 403
