"""Authentication of the embedded NATS of ``karios up`` (issue 24, S5).

Without it anyone on the machine could connect to the embedded nats-server and publish a command
(a provision) or read every event. So:

- :func:`load_or_create`: per state directory, once, ``<state>/nats-credentials.json`` (0600,
  kept across runs): the services' user and password and, for ``--cluster N``, the route user and
  password the servers authenticate each other with. Random, URL- and config-safe.
- :func:`render_config` (``templates/nats-server.conf.j2``) and :func:`write_private`: the
  nats-server configuration holding them, written 0600 beside the store at every start; the
  server reads it with ``-c``, so no secret is on a command line (``ps`` shows every argument).
- The services get them as ``KARIOS_NATS_USER`` / ``KARIOS_NATS_PASSWORD`` (a ``SecretStr``
  setting, never printed); the URL ``karios up`` prints holds no secret.

A configured NATS (``KARIOS_NATS_URL``) is the operator's: nothing here applies to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

CREDENTIALS_FILE = "nats-credentials.json"
SERVICE_USER = "karios"
ROUTE_USER = "karios-route"
TEMPLATE = "nats-server.conf.j2"
_FIELDS = ("user", "password", "route_user", "route_password")


class CredentialsError(RuntimeError):
    """The credentials file cannot be used; the message names it and what to do."""


@dataclass(frozen=True)
class NatsCredentials:
    """The embedded NATS's two logins; the passwords never show in a repr."""

    user: str
    password: str = field(repr=False)
    route_user: str
    route_password: str = field(repr=False)

    @classmethod
    def generate(cls) -> NatsCredentials:
        # token_urlsafe: [A-Za-z0-9_-] only, so nothing to escape in a URL or the config file.
        return cls(SERVICE_USER, secrets.token_urlsafe(32), ROUTE_USER, secrets.token_urlsafe(32))

    @property
    def passwords(self) -> tuple[str, str]:
        return self.password, self.route_password


def load_or_create(state: Path) -> NatsCredentials:
    """The credentials of ``state``: read from its file, or generated and written there (0600) on
    the first start. A file another process wrote in the meantime wins (created exclusively); a
    file that has become readable by others is made 0600 again."""
    path = state / CREDENTIALS_FILE
    if not path.exists():
        created = NatsCredentials.generate()
        text = json.dumps({name: getattr(created, name) for name in _FIELDS}, indent=1) + "\n"
        write_private(path, text, exclusive=True)
    try:
        doc = json.loads(path.read_text())
        creds = NatsCredentials(**{name: str(doc[name]) for name in _FIELDS})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CredentialsError(
            f"{path} is not a NATS credentials file ({type(exc).__name__}); remove it to generate "
            "new credentials at the next `karios up`"
        ) from None
    if any(not value or not _safe(value) for value in (creds.user, creds.route_user, *creds.passwords)):
        raise CredentialsError(f"{path} holds an empty or unusable value; remove it to generate new ones")
    if stat.S_IMODE(path.stat().st_mode) != 0o600:
        path.chmod(0o600)
    return creds


def write_private(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path``, mode 0600 from the first byte (a temp file in the same
    directory, then renamed). ``exclusive``: an existing ``path`` is kept (a link, not a rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@dataclass(frozen=True)
class ClusterConf:
    """One node's part of ``karios up --cluster N``: its route listener and its peers' routes."""

    name: str
    port: int
    peer_ports: list[int]

    @property
    def size(self) -> int:
        return len(self.peer_ports) + 1


def render_config(creds: NatsCredentials, cluster: ClusterConf | None = None) -> str:
    """The nats-server configuration: the services' login and, for a cluster node, the route
    listener with the route login and the routes to its peers (their URLs carrying it)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 (a nats-server config, not HTML: values go through conf_str)
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["conf_str"] = conf_str
    view = None
    if cluster is not None:
        login = f"{quote(creds.route_user, safe='')}:{quote(creds.route_password, safe='')}"
        view = {
            "name": cluster.name,
            "size": cluster.size,
            "listen": f"127.0.0.1:{cluster.port}",
            "routes": [f"nats-route://{login}@127.0.0.1:{port}" for port in cluster.peer_ports],
        }
    return env.get_template(TEMPLATE).render(creds=creds, cluster=view, credentials_file=CREDENTIALS_FILE)


def conf_str(value: object) -> str:
    """``value`` as a double-quoted nats-server config string (no variable expansion inside
    quotes); only printable ASCII, ``"`` and ``\\`` escaped."""
    text = str(value)
    if not _safe(text):
        # The value is not named: it may be a password.
        raise ValueError("not a printable ASCII string: refused in the nats-server config")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _safe(text: str) -> bool:
    return all(" " <= ch <= "~" for ch in text)
