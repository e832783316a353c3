"""Where the gateway is and which token to use: the client context file (mode 0600).

``karios up`` writes it (its gateway URL + the admin token); ``karios login URL`` writes it for a
remote system. ``KARIOS_URL`` / ``KARIOS_TOKEN`` override the file; ``KARIOS_CONFIG`` moves it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


def context_path() -> Path:
    if os.environ.get("KARIOS_CONFIG"):
        return Path(os.environ["KARIOS_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "karios" / "config.json"


@dataclass
class ClientContext:
    url: str = ""
    token: str = ""
    name: str = ""  # the token's name, as the gateway reported it at login

    def __repr__(self) -> str:  # never print the token
        return f"ClientContext(url={self.url!r}, name={self.name!r})"


def load_context() -> ClientContext:
    ctx = ClientContext()
    path = context_path()
    try:
        data = json.loads(path.read_text())
        ctx = ClientContext(
            url=str(data.get("url", "")), token=str(data.get("token", "")), name=str(data.get("name", ""))
        )
    except (OSError, ValueError, AttributeError):
        pass
    ctx.url = os.environ.get("KARIOS_URL") or ctx.url
    ctx.token = os.environ.get("KARIOS_TOKEN") or ctx.token
    ctx.url = ctx.url.rstrip("/")
    return ctx


def save_context(ctx: ClientContext, path: Path | None = None) -> Path:
    """Write the context readable by its owner only (created 0600, never briefly wider)."""
    path = path or context_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(ctx), f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
