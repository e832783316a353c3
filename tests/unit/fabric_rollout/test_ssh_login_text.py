"""A stored SSH user name or password that SSH cannot send (asyncssh SASLpreps both before it
connects: a ValueError) is the node's ``NodeUnreachable`` saying so — never a 500 of the diff,
post-deploy or apply that reached it (found by the gateway's stateful fuzzer; the API refuses
such values since, rows stored before may hold one). The password is never echoed."""

from __future__ import annotations

import socket

import pytest
from pydantic import SecretStr

from karios.fabric_worker.rollout.errors import NodeUnreachable
from karios.fabric_worker.rollout.intent import NodeTarget
from karios.fabric_worker.rollout.ssh import open_session


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("username", "password", "says"),
    [
        ("ro\x11ot", None, "stored SSH user name cannot be sent"),
        ("\U0006b3ea", None, "stored SSH user name cannot be sent"),
        ("root", "pa\x11ss-\U0006b3ea", "stored SSH password: SSH cannot send this password"),
    ],
    ids=["control character in the name", "unassigned name", "password"],
)
async def test_unsendable_login_is_unreachable_saying_so(username, password, says):
    target = NodeTarget(
        node_ip="127.0.0.1",
        ssh_port=_closed_port(),
        username=username,
        password=SecretStr(password) if password else None,
    )
    with pytest.raises(NodeUnreachable) as err:
        async with open_session(target, connect_timeout=2):
            pytest.fail("connected")
    assert says in err.value.message
    assert "pa\x11ss" not in err.value.message and "\U0006b3ea" not in err.value.message


async def test_a_sendable_login_still_reaches_the_connect():
    """The check refuses nothing SSH can send: a closed port is what fails here."""
    target = NodeTarget(node_ip="127.0.0.1", ssh_port=_closed_port(), password=SecretStr("pässwörd"))
    with pytest.raises(NodeUnreachable) as err:
        async with open_session(target, connect_timeout=2):
            pytest.fail("connected")
    assert "SSH connect failed" in err.value.message
