"""A job's request as the provisioner answers it (``q.provision.job_request``, the console's job
page and its retry): real NATS + PostgreSQL, inventory, provisioner and gateway. What was asked
comes back field for field; a password never does, only that there was one."""

from __future__ import annotations

import httpx
import pytest

from karios.api_gateway.auth import Role
from karios.api_gateway.console.views import controls_for, retry_of
from karios.common.contracts.provision import JobRequestQuery, JobRequestView
from karios.common.errors import NotFound
from tests.fixtures.apps import ADMIN
from tests.fixtures.provision import wait_job

pytestmark = [pytest.mark.integration, pytest.mark.lab]
SECRET = "console-s3cret-pw"


async def test_the_request_comes_back_without_its_secrets(stack):
    body = {
        "bmc_IP": stack.bmc_ips[0],
        "vendor": "dell",
        "hostname": "req-node",
        "debian_version": "12",
        "install_method": "preseed",
        "os_password": SECRET,
        "selected_disks": ["sda"],
        "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4ZQ op@example"],
        "rack_number": "R7",  # a field with no effect: kept in the metadata, asked for again
    }
    async with httpx.AsyncClient(base_url=stack.gw, timeout=60) as c:
        r = await c.post("/controlnode/provision", json=body, headers=ADMIN)
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        await wait_job(c, job, {"building_media", "mounting", "booting", "failed"}, timeout=120)
        bus = stack.app.state.runtime.bus
        subject = bus.subjects.query("provision", "job_request")
        view = await bus.request(subject, JobRequestQuery(job_id=job), reply=JobRequestView)
        assert (view.job_id, view.bmc_ip, view.vendor, view.hostname) == (
            job,
            stack.bmc_ips[0],
            "dell",
            "req-node",
        )
        assert (view.debian_version, view.install_method, view.method) == ("12", "preseed", "preseed")
        assert view.selected_disks == ["/dev/sda"] and view.ssh_authorized_keys == body["ssh_authorized_keys"]
        assert view.metadata == {"rack_number": "R7"}
        assert view.has_os_password and not view.has_root_pass
        assert SECRET not in view.model_dump_json() and "_enc" not in view.model_dump_json()
        with pytest.raises(NotFound):
            await bus.request(subject, JobRequestQuery(job_id="no-such-job"), reply=JobRequestView)

        # The console's retry of the ended job: the same request, accepted by the API as it is.
        await c.post(f"/controlnode/job/{job}/cancel", headers=ADMIN)
        await wait_job(c, job, {"cancelled", "failed"}, timeout=60)
        ended = (await c.get(f"/controlnode/job/{job}", headers=ADMIN)).json()
        retry = retry_of(ended, view, controls_for(Role.operator))
        assert retry is not None and retry.needs_os_password
        r = await c.post("/controlnode/provision", json={**retry.body, "os_password": SECRET}, headers=ADMIN)
        assert r.status_code == 202, r.text
        await wait_job(
            c, r.json()["job_id"], {"building_media", "mounting", "booting", "failed"}, timeout=120
        )
        again = await bus.request(subject, JobRequestQuery(job_id=r.json()["job_id"]), reply=JobRequestView)
        assert again.model_dump(exclude={"job_id"}) == view.model_dump(exclude={"job_id"})
        await c.post(f"/controlnode/job/{again.job_id}/cancel", headers=ADMIN)
