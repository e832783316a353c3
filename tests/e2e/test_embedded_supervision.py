"""Issue 24 (D4): the embedded NATS and PostgreSQL and every service die with ``karios up``, even
when it is SIGKILLed, and what a killed run leaves behind does not break the next one.

- SIGKILL of a ready ``karios up``: within 15 s no process of it is left (its process tree, the
  postmaster and its backends, anything naming the state directory). The next ``karios up`` on
  the same state directory — with the ``postmaster.pid`` a SIGKILLed postmaster leaves — says it
  removed the stale file, starts, and the token created in the first run still authenticates.
- A live orphan postmaster on the data directory (what a killed run left before this fix:
  ``pg_ctl start`` daemonizes it) is stopped, said on the console, not adopted; a data directory
  held by another running ``karios up`` is an error naming that process, at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from karios.cli.embedded import EmbeddedPostgres, StartError
from tests.fixtures.chaos import KariosUp, http_get, http_post, pg_ctl, state_dir
from tests.fixtures.wait import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def root() -> Iterator[Path]:
    with state_dir("karios-e2e-") as path:
        yield path


def _live(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _left(tree: list[psutil.Process], state: Path) -> list[str]:
    """Command lines of what is still running: of ``tree``, or naming ``state`` anywhere."""
    left = {p.pid: p for p in tree if _live(p)}
    for p in psutil.process_iter(["cmdline"]):
        if any(str(state) in a for a in p.info["cmdline"] or ()) and _live(p):
            left[p.pid] = p
    out = []
    for pid, p in left.items():
        with contextlib.suppress(psutil.Error):
            out.append(f"{pid}: {' '.join(p.cmdline()) or p.name()}")
    return out


def _postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])


@pytest.mark.timeout(420)
def test_sigkilled_karios_up_leaves_nothing_and_the_next_start_keeps_the_data(root: Path):
    state = root / "state"
    pgdata = state / "postgres"
    first = KariosUp(state)
    try:
        first.wait_started()
        status, body, _ = http_post(
            f"{first.url()}/controlnode/tokens", {"name": "kept-across-kill", "role": "viewer"}, first.token
        )
        assert status == 201, body
        kept = json.loads(body)["token"]
        stale = (pgdata / "postmaster.pid").read_text()
        postmaster = psutil.Process(_postmaster_pid(pgdata))
        tree = [*psutil.Process(first.proc.pid).children(recursive=True), postmaster]
        tree += postmaster.children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "nats-server" in names and "postgres" in names and "run api-gateway" in names, names
        first.proc.kill()
        first.proc.wait(10)
        t0 = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_until_sync(lambda: not _left(tree, state), timeout=15, what="every child to exit")
        left = _left(tree, state)
        assert not left, "left running after SIGKILL of karios up:\n" + "\n".join(left)
        print(f"karios up SIGKILL → nothing left in {time.monotonic() - t0:.1f} s")
    finally:
        if first.proc.poll() is None:
            first.stop()

    # A SIGKILLed postmaster leaves its postmaster.pid (the fast shutdown above removed it): put it
    # back, naming a pid that is no longer a postmaster, owned as the server wrote it.
    pidfile = pgdata / "postmaster.pid"
    pidfile.write_text(stale)
    pidfile.chmod(0o600)
    os.chown(pidfile, pgdata.stat().st_uid, pgdata.stat().st_gid)

    second = KariosUp(state)
    try:
        second.wait_started()
        assert f"removed stale {pidfile} (pid {postmaster.pid} " in second.text(), second.text()
        assert f"removed stale {pidfile}" in (state / "logs" / "karios.log").read_text()
        status, body, _ = http_get(f"{second.url()}/controlnode/tokens/self", kept)
        assert status == 200, body
        assert json.loads(body)["name"] == "kept-across-kill"
    finally:
        assert second.stop() == 0, second.text()


@pytest.mark.timeout(180)
def test_a_live_orphan_postmaster_is_stopped_and_a_held_data_dir_is_an_error(root: Path):
    pgdata = root / "postgres"
    said: list[str] = []
    pg = EmbeddedPostgres(root, say=said.append)
    sock = pg.start("postgres").split("host=", 1)[1]
    pg.stop()
    # The postmaster a killed `karios up` used to leave: daemonized by pg_ctl, parent gone.
    pg_ctl(pgdata, "-o", '-h ""', "-o", f"-k {sock}", "-l", str(pgdata / "log"), "start")
    orphan = psutil.Process(_postmaster_pid(pgdata))
    assert orphan.ppid() != os.getpid()

    pg = EmbeddedPostgres(root, say=said.append)
    try:
        t0 = time.monotonic()
        pg.start("postgres")
        took = time.monotonic() - t0
        assert not _live(orphan), "the orphan postmaster was adopted, not stopped"
        assert any(f"stopping a leftover PostgreSQL (pid {orphan.pid})" in s for s in said), said
        assert pg.proc is not None and _postmaster_pid(pgdata) == pg.proc.pid
        assert took < 45, f"start with an orphan took {took:.1f} s"

        # The data directory held by a running `karios up` (here: this process, through `pg`):
        # an error naming it, at once — its postmaster untouched, no wait.
        t0 = time.monotonic()
        with pytest.raises(StartError, match=rf"in use by another running karios \(pid {os.getpid()}\)"):
            EmbeddedPostgres(root, say=said.append).start("postgres")
        assert time.monotonic() - t0 < 5
        assert pg.proc.poll() is None and _postmaster_pid(pgdata) == pg.proc.pid
    finally:
        pg.stop()
    assert not (pgdata / "postmaster.pid").exists()
