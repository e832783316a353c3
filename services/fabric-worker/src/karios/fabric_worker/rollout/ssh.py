"""asyncssh adapter: connect with host-key verification, run commands, translate errors once.

Command output is scrubbed of the intent's secrets before it can reach an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import weakref
from collections.abc import AsyncIterator, Iterable

import asyncssh
from asyncssh.saslprep import SASLPrepError, saslprep

from karios.common.devicetext import ssh_password_problem
from karios.fabric_worker.rollout.errors import HostKeyChanged, NodeCommandFailed, NodeUnreachable
from karios.fabric_worker.rollout.intent import NodeTarget


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret in `text` by `***` (longest first, so overlapping secrets go too)."""
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


@dataclasses.dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


class NodeSession:
    """One SSH connection to a node."""

    def __init__(self, target: NodeTarget, conn: asyncssh.SSHClientConnection, secrets: list[str]) -> None:
        self.target = target
        self._conn = conn
        self._secrets = secrets
        key = conn.get_server_host_key()
        self.host_key = key.export_public_key("openssh").decode().strip() if key else ""
        self.host_key_first_seen = target.known_host_key is None

    async def run(
        self, command: str, *, input: str | None = None, limit_s: float = 60.0, check: bool = True
    ) -> CommandResult:
        """Run `command`; with `check`, a non-zero exit raises :class:`NodeCommandFailed`."""
        try:
            res = await asyncio.wait_for(self._conn.run(command, input=input, check=False), limit_s)
        except TimeoutError:
            raise NodeCommandFailed(f"{self.target.label}: command timed out after {limit_s:.0f} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise NodeCommandFailed(f"{self.target.label}: SSH session failed: {exc}") from None
        out = CommandResult(
            exit_status=res.exit_status if res.exit_status is not None else -1,
            stdout=str(res.stdout or ""),
            stderr=str(res.stderr or ""),
        )
        if check and out.exit_status != 0:
            detail = redact((out.stderr or out.stdout).strip(), self._secrets)[-500:]
            first = command.strip().splitlines()[0][:80]
            raise NodeCommandFailed(f"{self.target.label}: `{first}` exited {out.exit_status}: {detail}")
        return out

    async def lines(self, command: str, *, limit_s: float = 60.0) -> AsyncIterator[str]:
        """Run `command` and yield its stdout line by line as it comes (without the newline),
        each within `limit_s`. Stopping the iteration (``aclose``) closes the channel."""
        proc = None
        try:
            proc = await asyncio.wait_for(
                self._conn.create_process(command, stderr=asyncssh.DEVNULL), limit_s
            )
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), limit_s)
                if not line:
                    return
                yield str(line).rstrip("\n")
        except TimeoutError:
            raise NodeCommandFailed(f"{self.target.label}: command timed out after {limit_s:.0f} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise NodeCommandFailed(f"{self.target.label}: SSH session failed: {exc}") from None
        finally:
            if proc is not None:
                proc.close()

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (closed by either side)."""
        return self._conn.is_closed()

    async def close(self) -> None:
        self._conn.close()
        with contextlib.suppress(Exception):
            await self._conn.wait_closed()


def _known_hosts(target: NodeTarget):
    if target.known_host_key is None:
        return None  # first contact: accept and report the key for the caller to store
    try:
        key = asyncssh.import_public_key(target.known_host_key)
    except (asyncssh.KeyImportError, ValueError):
        raise HostKeyChanged(f"{target.label}: stored host key is not a valid public key") from None
    return ([key], [], [])


# SSH handshakes in flight at once, per event loop. A job connecting to 50 nodes at once on a
# small machine queues 50 handshakes (the worker's and 50 sshd re-execs): each then takes longer
# than `connect_timeout` and fails. Queued here instead, the timeout measures the handshake alone.
# 8 was too few once the nodes' commands got cheap (lab, 50 nodes, 2 cores: with 8 the queue, not
# the CPU, decided when the last node started, CPU 66 % busy, apply 18.4 s; 16: 13.6 s; 32: 10.5 s,
# CPU 96 % busy, the slowest handshake + discovery 2.3 s, well within the connect timeout).
CONNECT_CONCURRENCY = 32
_connect_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    sem = _connect_slots.get(loop)
    if sem is None:
        sem = _connect_slots[loop] = asyncio.Semaphore(CONNECT_CONCURRENCY)
    return sem


async def _connect(target: NodeTarget, keys: list, connect_timeout: float) -> asyncssh.SSHClientConnection:
    return await asyncio.wait_for(
        asyncssh.connect(
            target.host,
            target.ssh_port,
            username=target.username,
            client_keys=keys or None,
            password=target.password.get_secret_value() if target.password else None,
            known_hosts=_known_hosts(target),
            config=None,
            agent_path=None,
            connect_timeout=connect_timeout,
            login_timeout=connect_timeout,
        ),
        connect_timeout + 1,
    )


def _check_login(target: NodeTarget) -> None:
    """A stored user name or password SSH cannot send (asyncssh SASLpreps both; the API refuses
    them since the gateway fuzzer found a 500, older rows may hold one): unreachable, saying so."""
    try:
        saslprep(target.username)
    except SASLPrepError:
        raise NodeUnreachable(
            f"{target.label}: the stored SSH user name cannot be sent by SSH (SASLprep, RFC 4013)"
        ) from None
    if target.password is not None and (problem := ssh_password_problem(target.password.get_secret_value())):
        raise NodeUnreachable(f"{target.label}: the stored SSH password: {problem}")


@contextlib.asynccontextmanager
async def open_session(
    target: NodeTarget, *, connect_timeout: float = 10.0, secrets: list[str] | None = None
) -> AsyncIterator[NodeSession]:
    """Connect to `target`; raises NodeUnreachable or HostKeyChanged (nothing ran on the node)."""
    _check_login(target)
    keys = []
    if target.private_key is not None:
        try:
            keys.append(asyncssh.import_private_key(target.private_key.get_secret_value()))
        except (asyncssh.KeyImportError, ValueError):
            raise NodeUnreachable(f"{target.label}: the stored SSH private key cannot be read") from None
    try:
        async with _slots():
            conn = await _connect(target, keys, connect_timeout)
    except asyncssh.HostKeyNotVerifiable:
        raise HostKeyChanged(
            f"{target.label}: host key changed (does not match the stored key); refusing to connect"
        ) from None
    except asyncssh.PermissionDenied:
        raise NodeUnreachable(f"{target.label}: SSH authentication failed") from None
    except TimeoutError:
        raise NodeUnreachable(
            f"{target.label}: SSH connect timed out after {connect_timeout:.0f} s"
        ) from None
    except (asyncssh.Error, OSError) as exc:
        raise NodeUnreachable(f"{target.label}: SSH connect failed: {exc}") from None
    session = NodeSession(target, conn, list(secrets or []))
    try:
        yield session
    finally:
        await session.close()
