"""Issue 24 S5: adoption does not tell a caller whether a port refused, the connection was lost or
timed out (a port scanner otherwise); what the node's sshd answered after the connection is said."""

from __future__ import annotations

from karios.common.contracts.nodes import PinNodeHostKey
from karios.fabric_worker.rollout.errors import NodeUnreachable
from karios.fabric_worker.rollout.nodes import _one_answer


def test_every_connection_failure_is_one_message():
    q = PinNodeHostKey(node_ip="192.0.2.7", ssh_port=2222, os_username="root")
    causes = [
        "192.0.2.7: SSH connect failed: [Errno 111] Connect call failed ('192.0.2.7', 2222)",
        "192.0.2.7: SSH connect failed: Connection lost",
        "192.0.2.7: SSH connect timed out after 10 s",
        "192.0.2.7: SSH connect failed: [Errno 113] No route to host",
    ]
    answers = {_one_answer(q, NodeUnreachable(c)).message for c in causes}
    assert len(answers) == 1
    (answer,) = answers
    assert answer.startswith("192.0.2.7 port 2222: could not connect over SSH")
    assert not any(w in answer for w in ("Errno", "lost", "timed out", "route"))


def test_what_the_sshd_said_is_kept():
    q = PinNodeHostKey(node_ip="192.0.2.7", ssh_port=22, os_username="root")
    auth = NodeUnreachable("192.0.2.7: SSH authentication failed")
    assert _one_answer(q, auth) is auth
