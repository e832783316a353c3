"""The rollout's scale-related pieces: a whole commit as one SSH exec (files split from one stdin,
byte for byte), the verify as one remote poll loop, and a verify poll budget flat in N.

The scripts are run by a real `sh` against a temporary directory standing in for /etc/frr."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from karios.fabric_worker.rollout import ssh
from karios.fabric_worker.rollout.errors import NodeUnreachable
from karios.fabric_worker.rollout.facts import EVPN_SUMMARY_COMMAND, FRRINIT
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.node import RolloutOptions
from karios.fabric_worker.rollout.plan import FrrAction, FrrPlan, commit_script
from karios.fabric_worker.rollout.verify import (
    BGP_PORT,
    VERIFY_NO_SESSION,
    parse_evpn_summary,
    proc_net_tcp_addr,
    verify_loop_script,
)

SECRET = "hunter2-ü"  # non-ASCII: the byte count, not the character count, must be used


def _local(script: str, etc: Path) -> str:
    """The script against `etc` instead of /etc/frr, with the frr owner and FRR itself left out."""
    return (
        script.replace("/etc/frr", str(etc))
        .replace("chown frr:frr", "true")
        .replace(f"{FRRINIT} ", "echo frr-action ")
    )


@pytest.mark.skipif(shutil.which("dd") is None, reason="needs coreutils dd")
def test_commit_writes_every_file_byte_for_byte_from_one_stdin(tmp_path: Path) -> None:
    frr = f"frr defaults datacenter\n neighbor 198.18.0.1 password {SECRET}\n" * 40
    daemons = "bgpd=yes\nzebra=yes\n"
    (tmp_path / "vtysh.conf").write_text("old")
    plan = FrrPlan({"frr.conf": frr, "daemons": daemons, "vtysh.conf": None}, FrrAction.RESTART)
    script, data = commit_script(plan, ["echo link-change"])
    assert SECRET not in script  # contents only over stdin
    out = subprocess.run(
        ["sh", "-c", _local(script, tmp_path)], input=data.encode(), capture_output=True, check=True
    )
    assert (tmp_path / "frr.conf").read_bytes() == frr.encode()
    assert (tmp_path / "daemons").read_bytes() == daemons.encode()
    assert not (tmp_path / "vtysh.conf").exists()
    assert stat.S_IMODE(os.stat(tmp_path / "frr.conf").st_mode) == 0o640
    assert out.stdout.decode().split() == ["link-change", "frr-action", "restart"]


def test_commit_order_stop_first_and_network_after_for_a_stopping_rollback(tmp_path: Path) -> None:
    plan = FrrPlan({"frr.conf": ""}, FrrAction.STOP)
    script, data = commit_script(plan, ["echo link-change"], net_first=False)
    assert data == ""
    out = subprocess.run(["sh", "-c", _local(script, tmp_path)], capture_output=True, check=True, text=True)
    assert out.stdout.split() == ["frr-action", "stop", "link-change"]
    assert (tmp_path / "frr.conf").read_bytes() == b""
    assert commit_script(FrrPlan({}, FrrAction.NONE)) == ("", "")


def test_commit_stops_at_the_first_failing_command(tmp_path: Path) -> None:
    plan = FrrPlan({"frr.conf": "x\n"}, FrrAction.START)
    script, data = commit_script(plan, ["false"])
    res = subprocess.run(["sh", "-c", _local(script, tmp_path)], input=data, capture_output=True, text=True)
    assert res.returncode != 0 and not (tmp_path / "frr.conf").exists()


def test_short_stdin_fails_the_write_instead_of_writing_a_truncated_file(tmp_path: Path) -> None:
    plan = FrrPlan({"frr.conf": "0123456789\n"}, FrrAction.NONE)
    script, _ = commit_script(plan)
    res = subprocess.run(
        ["sh", "-c", _local(script, tmp_path)], input="01234", capture_output=True, text=True
    )
    assert res.returncode != 0 and not (tmp_path / "frr.conf").exists()


def _fake_vtysh(tmp_path: Path, states: list[str]) -> dict[str, str]:
    """A `vtysh` answering the EVPN summary with the next of `states` (multi-line JSON, as FRR)."""
    seq = tmp_path / "seq"
    seq.write_text("0")
    docs = [
        json.dumps({"peers": {"198.18.0.1": {"state": s, "pfxRcd": 1, "pfxSnt": 2}}}, indent=2)
        for s in states
    ]
    for i, d in enumerate(docs):
        (tmp_path / f"doc{i}").write_text(d)
    last = len(docs) - 1
    exe = tmp_path / "vtysh"
    exe.write_text(
        f'#!/bin/sh\ni=$(cat {seq}); [ "$i" -gt {last} ] && i={last}; echo $((i+1)) > {seq}\n'
        f'[ "$i" -eq 0 ] && {{ echo "bgpd is not running" >&2; exit 1; }}\ncat {tmp_path}/doc$i\n'
    )
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_verify_loop_streams_one_parseable_line_per_poll_and_ends_by_itself(tmp_path: Path) -> None:
    env = _fake_vtysh(tmp_path, ["x", "Connect", "Established"])
    assert EVPN_SUMMARY_COMMAND in verify_loop_script(0.05, 4)
    t0 = time.monotonic()
    out = subprocess.run(
        ["sh", "-c", verify_loop_script(0.05, 4)], env=env, capture_output=True, text=True, timeout=10
    )
    lines = out.stdout.split("\n")[:-1]
    assert len(lines) == 4 and time.monotonic() - t0 >= 0.15
    assert lines[0] == ""  # vtysh failed: an empty line, judged "not configured"
    states = [p.state if (p := parse_evpn_summary(line, "198.18.0.1")) else None for line in lines]
    assert states == [None, "Connect", "Established", "Established"]


def test_verify_loop_exits_once_the_reader_is_gone(tmp_path: Path) -> None:
    env = _fake_vtysh(tmp_path, ["Established"])
    proc = subprocess.Popen(["sh", "-c", verify_loop_script(0.05, 10_000)], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # the SSH channel closed
    assert proc.wait(timeout=5) is not None


def test_verify_poll_budget_keeps_the_poll_rate_flat_in_n() -> None:
    opts = RolloutOptions(verify_interval=0.3, verify_polls_per_s=40.0)
    assert opts.for_fanout(3).verify_interval == 0.3
    for n in (25, 50, 200):
        assert n / opts.for_fanout(n).verify_interval == pytest.approx(40.0, rel=0.05)
    assert RolloutOptions(verify_interval=0.3, verify_polls_per_s=0).for_fanout(50).verify_interval == 0.3


async def test_ssh_handshakes_are_queued_not_all_started_at_once() -> None:
    """50 connects to a listener that accepts and never answers: at most CONNECT_CONCURRENCY are
    in flight at a time, and each fails after its own connect_timeout (not the queue's wait)."""
    live, peak, writers = 0, 0, []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        writers.append(writer)
        await reader.read()  # until the client gives up
        live -= 1
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def one() -> str:
        target = NodeTarget(node_ip="127.0.0.1", ssh_port=port, password="x")
        try:
            async with ssh.open_session(target, connect_timeout=0.3):
                return "connected"
        except NodeUnreachable as exc:
            return exc.message

    n = 3 * ssh.CONNECT_CONCURRENCY
    t0 = time.monotonic()
    async with server:
        results = await asyncio.gather(*(one() for _ in range(n)))
    assert all("timed out after" in r for r in results), results[:3]
    assert peak == ssh.CONNECT_CONCURRENCY
    assert time.monotonic() - t0 >= 3 * 0.3  # three waves, each within its own timeout


def _gated_loop(polls: int, port: int) -> str:
    """The gated verify loop against 127.0.0.1:`port` instead of the peer's BGP port."""
    script = verify_loop_script(0.01, polls, "127.0.0.1")
    assert f" {proc_net_tcp_addr('127.0.0.1')}:{BGP_PORT:04X} 01 " in script
    return script.replace(f":{BGP_PORT:04X}", f":{port:04X}")


def test_proc_net_tcp_addr_is_the_kernels_spelling() -> None:
    assert proc_net_tcp_addr("198.18.0.1") == "010012C6"
    assert proc_net_tcp_addr("127.0.0.1") == "0100007F"


def test_verify_loop_runs_vtysh_only_once_a_tcp_session_to_the_peer_exists(tmp_path: Path) -> None:
    """No session: each poll prints the no-session marker (vtysh only on every 8th and the last
    poll); with an established connection to the peer's port, every poll runs vtysh."""
    env = _fake_vtysh(tmp_path, ["x", "Established"])  # its first run fails: bgpd not up yet
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with listener:
        idle = subprocess.run(
            ["sh", "-c", _gated_loop(10, port)], env=env, capture_output=True, text=True, timeout=10
        ).stdout.split("\n")[:-1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = listener.accept()
            with conn:
                live = subprocess.run(
                    ["sh", "-c", _gated_loop(3, port)], env=env, capture_output=True, text=True, timeout=10
                ).stdout.split("\n")[:-1]
        del client
    ran = [i for i, line in enumerate(idle) if line != VERIFY_NO_SESSION]
    assert ran == [1, 9], idle  # n = 9 (9 % 8 == 1) and the last poll (n = 1)
    assert idle[1] == ""  # vtysh failed: judged "not configured", as before
    assert parse_evpn_summary(idle[9], "198.18.0.1").state == "Established"
    assert all(parse_evpn_summary(line, "198.18.0.1") is not None for line in live) and len(live) == 3
