"""The embedded nats-server(s) of ``karios up`` with the state directory's credentials (issue 24,
S5), started here without the services (seconds, not a whole ``karios up``; the full run is in
tests/e2e/test_embedded_restart.py):

- one server: a client without the login (or with a wrong password) is refused with
  "Authorization Violation"; the services' bus (``Bus.from_settings`` with ``KARIOS_NATS_USER`` /
  ``KARIOS_NATS_PASSWORD``) starts and stores an event; the config file is 0600; neither its
  command line nor its log holds the password; a restart (the supervisor's ``spawn``) keeps the
  login;
- ``--cluster 3``: the nodes route to each other with the route login (an R3 stream stores a
  message), while a nats-server that knows the route port but not the login is refused ("Route
  Error 'Authorization Violation'") and never becomes a route of the cluster.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import nats
import nats.errors
import psutil
import pytest
from nats.js.api import StreamConfig

from karios.cli.embedded import EmbeddedNats, nats_cluster, nats_server_binary
from karios.cli.nats_auth import load_or_create
from karios.common.bus.runtime import Bus
from karios.common.contracts.base import Event
from karios.common.settings import KariosSettings
from tests.fixtures.apps import free_port
from tests.fixtures.wait import wait_until, wait_until_sync

pytestmark = pytest.mark.integration


class AuthProbe(Event):
    TYPE = "karios.test.auth_probe.v1"
    n: int = 0


async def _refused(servers: list[str] | str, **login: str) -> str:
    with pytest.raises(nats.errors.Error) as err:
        nc = await nats.connect(
            servers, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **login
        )
        await nc.close()
    return str(err.value)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


async def _publish_or_none(js, subject: str, payload: bytes):  # type: ignore[no-untyped-def]
    try:
        return await js.publish(subject, payload, timeout=2)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return None


async def test_one_embedded_server_admits_only_the_state_dirs_login(tmp_path: Path):
    state = tmp_path
    creds = load_or_create(state)
    server = EmbeddedNats(state, creds)
    url = server.start()
    try:
        assert "Authorization Violation" in await _refused(url)
        assert "Authorization Violation" in await _refused(url, user=creds.user, password="wrong")
        assert stat.S_IMODE(server.conf.stat().st_mode) == 0o600
        argv = " ".join(psutil.Process(server.proc.pid).cmdline())  # what `ps` shows
        assert f"-c {server.conf}" in argv and creds.password not in argv

        settings = KariosSettings(  # type: ignore[call-arg]
            _env_file=None, dev_mode=True, nats_url=url, nats_user=creds.user, nats_password=creds.password
        )
        settings = settings.model_copy(update={"bus_prefix": "authprobe"})
        bus = Bus.from_settings(settings, "auth-test")
        await bus.start()
        try:
            ack = await bus.publish_event(AuthProbe(n=1), bus.subjects.evt("test", "probed", "one"))
            assert ack.seq >= 1 and await bus.healthy()
        finally:
            await bus.stop()

        # The supervisor's restart (same ports, the config written again): still a login.
        server.stop()
        server.spawn()
        await wait_until(lambda: _port_open(server.port), timeout=20, what="the restarted nats-server")
        assert "Authorization Violation" in await _refused(url)
        nc = await nats.connect(url, user=creds.user, password=creds.password)
        await nc.close()
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "Server is ready" in log and creds.password not in log


async def test_cluster_nodes_route_with_the_route_login_and_refuse_a_server_without_it(tmp_path: Path):
    state = tmp_path
    creds = load_or_create(state)
    nodes = nats_cluster(state, 3)
    procs: list[subprocess.Popen[bytes]] = []
    intruder_log = state / "intruder.log"
    try:
        for node in nodes:
            node.write_config(nodes, creds)
            with open(state / f"{node.name}.log", "wb") as log:
                procs.append(subprocess.Popen(node.argv(nodes, config=True), stdout=log, stderr=log))
        _wait_healthy(nodes, procs, state)
        servers = [n.url for n in nodes]
        assert "Authorization Violation" in await _refused(servers[1])

        nc = await nats.connect(servers, user=creds.user, password=creds.password)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="AUTH_R3", subjects=["authr3.>"], num_replicas=3))
            # The R3 stream elects its leader after the create answers: until it has one, a publish
            # gets "no responders" (the CI failure of stop 30 under load), so it is retried until
            # the stream stores it.
            ack = await wait_until(
                lambda: _publish_or_none(js, "authr3.x", b"routed"),
                timeout=30,
                what="the R3 stream's leader to store a message",
            )
            assert ack.seq == 1  # stored on all three nodes
        finally:
            await nc.close()

        # A server that knows the route port but not the route login.
        with open(intruder_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        nats_server_binary(),
                        *("-n", "intruder", "-a", "127.0.0.1", "-p", str(free_port())),
                        *("--cluster_name", "karios", "--cluster", f"nats://127.0.0.1:{free_port()}"),
                        *("--routes", f"nats://127.0.0.1:{nodes[0].cluster_port}"),
                    ],
                    stdout=log,
                    stderr=log,
                )
            )
        wait_until_sync(
            lambda: "Route Error 'Authorization Violation'" in intruder_log.read_text(),
            timeout=20,
            what="the intruder's route refused",
        )
        monitor = f"http://127.0.0.1:{nodes[0].monitor_port}/routez"
        remotes = {r.get("remote_name") for r in _get(monitor)["routes"]}
        assert remotes == {"karios-n2", "karios-n3"}, remotes
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    for node in nodes:
        log = (state / f"{node.name}.log").read_text()
        assert not any(pw in log for pw in creds.passwords), node.name


def _wait_healthy(nodes: list, procs: list[subprocess.Popen[bytes]], state: Path) -> None:
    """All three answer /healthz 200: each has a meta leader, which the JetStream election gives
    within seconds on an idle machine. In stop 41's CI, beside TCG guests, karios-n1 was not
    healthy after 30 s, and the failure kept no log. So the wait is as long as ``karios up``'s own
    default (90 s); a server that exits (a port free_port chose taken by then) ends it at once; and
    either failure shows each server's /healthz answer and log."""
    try:
        wait_until_sync(
            lambda: any(p.poll() is not None for p in procs) or all(_healthy(n.ready_url) for n in nodes),
            timeout=90,
            what="the three nodes healthy",
        )
        ended = zip(nodes, procs, strict=True)
        exited = [f"{n.name} exited {p.returncode}" for n, p in ended if p.poll() is not None]
        if exited:
            raise AssertionError(", ".join(exited))
    except AssertionError as e:
        tails = []
        for n in nodes:
            health = _health_text(n.ready_url)
            log = (state / f"{n.name}.log").read_text(errors="replace").splitlines()[-15:]
            tails.append(f"--- {n.name} /healthz: {health}\n" + "\n".join(log))
        raise AssertionError(f"{e}\n" + "\n".join(tails)) from None


def _health_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return f"{r.status} {r.read(300)!r}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read(300)!r}"
    except OSError as e:
        return repr(e)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
