"""The NetBox lab's seed (``tests/lab/netbox-seed/``): the migrated schema a fresh machine restores
instead of running ``netbox migrate`` (minutes of a core). It must exist for the NetBox version
``netbox.sh`` installs (a seed of another version is never used: a fresh CI run would silently
migrate again), restore on the real PostgreSQL, hold NetBox's migrations and nothing of a user —
no account, no token (``netbox.sh`` creates those, with secrets of the machine, after the restore).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = [pytest.mark.integration]

LAB = Path(__file__).resolve().parents[2] / "lab"


def _netbox_version() -> str:
    m = re.search(r"^NETBOX_VERSION=(\S+)$", (LAB / "netbox.sh").read_text(), re.M)
    assert m, "netbox.sh sets no NETBOX_VERSION"
    return m.group(1)


def test_the_seed_is_for_the_netbox_version_the_lab_installs():
    version = _netbox_version()
    seeds = sorted(p.name for p in (LAB / "netbox-seed").glob("*.dump"))
    assert seeds == [f"netbox-{version}.dump"], (
        f"tests/lab/netbox-seed/ holds {seeds}; netbox.sh installs {version}: run `tests/lab/netbox.sh seed`"
    )


async def test_the_seed_restores_with_netbox_migrations_and_no_user_or_token(database_url: str):
    if not shutil.which("pg_restore"):
        pytest.skip("pg_restore is not installed (postgresql-client)")
    url = sa.engine.make_url(database_url)
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    seed = LAB / "netbox-seed" / f"netbox-{_netbox_version()}.dump"
    proc = subprocess.run(
        ["pg_restore", "--no-owner", "--no-acl", "-d", libpq, str(seed)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as c:

            async def count(sql: str) -> int:
                return int((await c.execute(sa.text(sql))).scalar_one())

            assert await count("SELECT count(*) FROM users_user") == 0
            assert await count("SELECT count(*) FROM users_token") == 0
            # NetBox's own apps are migrated (not an empty or foreign dump).
            for app in ("dcim", "ipam", "extras", "users", "core"):
                assert await count(f"SELECT count(*) FROM django_migrations WHERE app = '{app}'") > 0, app
            assert await count("SELECT count(*) FROM django_content_type WHERE app_label = 'dcim'") > 10
            # The tables the Karios inventory reads and writes exist.
            for table in ("dcim_device", "dcim_interface", "ipam_ipaddress", "extras_customfield"):
                assert await count(f"SELECT count(*) FROM {table}") == 0, table
    finally:
        await engine.dispose()
