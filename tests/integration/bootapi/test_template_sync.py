"""Templates from git: a local bare repository, real ``git``, bootapi re-pulling every 0.2 s."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from karios.bootapi.app import create_app
from karios.common.oscatalog import default_set_dir
from tests.fixtures.bootapi import boot_settings
from tests.fixtures.wait import wait_until

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


class TemplatesRepo:
    def __init__(self, root: Path) -> None:
        self.bare, self.work = root / "templates.git", root / "work"
        self.git("init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        shutil.copytree(default_set_dir(), self.work)
        self.git("init", "--quiet", "--initial-branch=main", cwd=self.work)
        self.git("remote", "add", "origin", str(self.bare), cwd=self.work)
        self.commit("embedded defaults")

    @staticmethod
    def git(*args: str, cwd: Path | None = None) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.net", *args],
            cwd=cwd,
            check=True,
            capture_output=True,
        )

    def edit(self, rel: str, old: str, new: str) -> None:
        p = self.work / rel
        text = p.read_text()
        assert old in text
        p.write_text(text.replace(old, new, 1))

    def commit(self, message: str) -> None:
        self.git("add", "-A", cwd=self.work)
        self.git("commit", "--quiet", "-m", message, cwd=self.work)
        self.git("push", "--quiet", "origin", "main", cwd=self.work)


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


async def wait_for_metric(c: httpx.AsyncClient, name: str, at_least: float, timeout: float = 15) -> str:
    """The metrics text once ``name`` is at least ``at_least``."""

    async def reached() -> str | None:
        text = (await c.get("/metrics")).text
        return text if metric(text, name) >= at_least else None

    return await wait_until(reached, timeout=timeout, interval=0.1, what=f"{name} >= {at_least}")


async def test_git_push_is_served_and_a_broken_push_keeps_the_last_good_set(
    settings, inventory, serve, tmp_path
):
    repo = TemplatesRepo(tmp_path)
    app = await serve(
        create_app(
            settings, boot_settings(template_git_url=f"file://{repo.bare}", template_git_interval="200ms")
        )
    )
    async with httpx.AsyncClient(base_url=app.url) as c:
        await wait_for_metric(c, "bootapi_template_generation", 2)  # embedded = 1, first clone = 2

        repo.edit("templates/ipxe/boot.ipxe.j2", "#!ipxe\n", "#!ipxe\n# template revision two\n")
        repo.commit("v2")
        text = await wait_for_metric(c, "bootapi_template_generation", 3)
        assert metric(text, "bootapi_template_sync_failures_total") == 0
        assert "# template revision two" in (await c.get("/ipxe/52:54:00:aa:00:11")).text

        repo.edit("templates/ipxe/boot.ipxe.j2", "{% endfor %}", "{% endfor")  # syntax error
        repo.commit("broken")
        text = await wait_for_metric(c, "bootapi_template_sync_failures_total", 1)
        assert metric(text, "bootapi_template_generation") == 3
        assert (await c.get("/readyz")).status_code == 200
        r = await c.get("/ipxe/52:54:00:aa:00:11")
        assert r.status_code == 200 and "# template revision two" in r.text

        repo.edit("templates/ipxe/boot.ipxe.j2", "{% endfor", "{% endfor %}")
        repo.edit("templates/ipxe/boot.ipxe.j2", "revision two", "revision four")
        repo.commit("fixed")
        await wait_for_metric(c, "bootapi_template_generation", 4)
        assert "# template revision four" in (await c.get("/ipxe/52:54:00:aa:00:11")).text


async def test_unreachable_repo_serves_embedded_defaults(settings, inventory, serve, tmp_path):
    app = await serve(
        create_app(
            settings,
            boot_settings(template_git_url=f"file://{tmp_path}/nope.git", template_git_interval="200ms"),
        )
    )
    async with httpx.AsyncClient(base_url=app.url) as c:
        text = await wait_for_metric(c, "bootapi_template_sync_failures_total", 1)
        assert metric(text, "bootapi_template_generation") == 1
        assert (await c.get("/readyz")).status_code == 200
        assert "inst.ks=" in (await c.get("/ipxe/52:54:00:aa:00:11")).text
