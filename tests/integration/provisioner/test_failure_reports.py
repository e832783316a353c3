"""A failure report the gateway cannot parse still fails its job (issue 25 item 1): real NATS +
PostgreSQL, the Redfish emulator, inventory, provisioner and gateway; the installer is played by
the test with the body a live environment whose awk escaped zstd's words wrongly would send.

Only a body that says ``"state": "failed"`` is taken so (any other unreadable body stays a 422),
and only with the job's token (a wrong one is the same 401 as always)."""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import medium_token, wait_job

pytestmark = [pytest.mark.integration, pytest.mark.lab]

ZSTD = "/*stdin*\\ : Decoding error (36) : Data corruption detected"  # its backslash is the point
#: What mawk made of gsub(/\\/, "\\\\"): the backslash went out unescaped — not JSON.
BROKEN = b'{"step": "base-system", "state": "failed", "percent": 0, "message": "' + ZSTD.encode() + b'"}'


async def test_an_unreadable_failure_report_fails_the_job_with_its_raw_text(stack):
    ip = stack.bmc_ips[0]
    async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
        body = {"bmc_IP": ip, "vendor": "dell", "hostname": "raw-node"}
        r = await c.post("/controlnode/provision/dell", json=body, headers=ADMIN)
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"booting"}, timeout=180)
        token, _ = medium_token(stack.cfg.media_dir / f"{job}.iso")
        url = f"/controlnode/job/{job}/step"
        json_ct = {"Content-Type": "application/json"}

        # An unreadable progress report is still a 422 naming what is wrong; the job goes on.
        progress = b'{"step": "mirror", "state": "active", "message": "C:\\ bad"}'
        r = await c.post(url, content=progress, headers={**json_ct, "X-Karios-Job-Token": token})
        assert r.status_code == 422 and r.json()["code"] == "VALIDATION_FAILED", r.text
        # A wrong token is refused as always, whatever the body says.
        r = await c.post(url, content=BROKEN, headers={**json_ct, "X-Karios-Job-Token": "wrong"})
        assert r.status_code == 401, r.text
        got = (await c.get(f"/controlnode/job/{job}", headers=ADMIN)).json()
        assert got["job_status"] in {"booting", "installing"}, got

        # The installer's failure, unreadable: accepted at once, the job failed with its words.
        r = await c.post(url, content=BROKEN, headers={**json_ct, "X-Karios-Job-Token": token})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "failed", r.json()
        done = await wait_job(c, job, {"failed"}, timeout=30)
        msg = done["message"]
        assert "unreadable failure report" in msg and ZSTD in msg, msg
        assert msg.startswith("Installing the base system") or "base-system" in msg, msg
        # Nothing more is taken from the job's token once it has failed.
        r = await c.post(url, content=BROKEN, headers={**json_ct, "X-Karios-Job-Token": token})
        assert r.status_code == 409, r.text
