"""Where the gateway is and which token to use: the client context files (mode 0600).

The default context is one file: ``$KARIOS_CONFIG``, else ``$XDG_CONFIG_HOME/karios/config.json``,
else ``~/.config/karios/config.json``. A named context (``karios --context NAME …`` or
``KARIOS_CONTEXT=NAME``) is ``contexts/NAME.json`` beside it, so two systems on one machine keep
their own URL and token. ``karios up`` writes its context under a name (``--context``, else its
state directory's name) and as the default; ``karios login URL`` writes the selected one.
``KARIOS_URL`` / ``KARIOS_TOKEN`` override whatever file was read.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from karios.cli.client.errors import CliError

#: A context name: a file name anywhere (no path separator, no leading dot).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT = "default"


def context_path() -> Path:
    """The default context's file."""
    if os.environ.get("KARIOS_CONFIG"):
        return Path(os.environ["KARIOS_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "karios" / "config.json"


def contexts_dir() -> Path:
    return context_path().parent / "contexts"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise CliError(
            f"context name {name!r}: letters, digits, '.', '_' and '-' only (at most 64, not starting "
            "with '.', '_' or '-')",
            2,
        )
    return name


def selected_name(name: str | None = None) -> str:
    """The context asked for: `name` (``--context``), else ``$KARIOS_CONTEXT``, else the default."""
    return check_name(name or os.environ.get("KARIOS_CONTEXT") or DEFAULT)


def named_path(name: str) -> Path:
    """The file of context `name` (``default``: the default file)."""
    return context_path() if check_name(name) == DEFAULT else contexts_dir() / f"{name}.json"


def context_names() -> list[str]:
    """The named contexts on this machine (``default`` first when its file exists)."""
    names = sorted(p.stem for p in contexts_dir().glob("*.json") if NAME_RE.fullmatch(p.stem))
    return ([DEFAULT] if context_path().exists() else []) + [n for n in names if n != DEFAULT]


@dataclass
class ClientContext:
    url: str = ""
    token: str = ""
    name: str = ""  # the token's name, as the gateway reported it at login

    def __repr__(self) -> str:  # never print the token
        return f"ClientContext(url={self.url!r}, name={self.name!r})"


def load_context(name: str | None = None) -> ClientContext:
    """The selected context (see :func:`selected_name`) with ``KARIOS_URL``/``KARIOS_TOKEN`` applied.
    A named context whose file does not exist is an error naming the known ones (exit 2), unless
    ``KARIOS_URL`` says where the gateway is."""
    ctx = ClientContext()
    chosen = selected_name(name)
    path = named_path(chosen)
    try:
        data = json.loads(path.read_text())
        ctx = ClientContext(
            url=str(data.get("url", "")), token=str(data.get("token", "")), name=str(data.get("name", ""))
        )
    except FileNotFoundError:
        if chosen != DEFAULT and not os.environ.get("KARIOS_URL"):
            known = ", ".join(context_names()) or "none"
            raise CliError(
                f"no context {chosen!r} ({path} does not exist; known: {known}); "
                f"`karios --context {chosen} login URL --token …` creates it",
                2,
            ) from None
    except (OSError, ValueError, AttributeError):
        pass
    ctx.url = os.environ.get("KARIOS_URL") or ctx.url
    ctx.token = os.environ.get("KARIOS_TOKEN") or ctx.token
    ctx.url = ctx.url.rstrip("/")
    return ctx


def save_context(ctx: ClientContext, path: Path | None = None, *, name: str | None = None) -> Path:
    """Write the context readable by its owner only (created 0600, never briefly wider): to
    `path`, else to context `name`'s file, else to the selected context's."""
    path = path or named_path(name or selected_name())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(ctx), f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def up_context_name(state: Path, name: str | None = None) -> str:
    """The name ``karios up`` keeps its context under: `name` (``--context``), else
    ``$KARIOS_CONTEXT``, else its state directory's name (``karios``, ``demo``, …)."""
    chosen = (
        name or os.environ.get("KARIOS_CONTEXT") or re.sub(r"[^A-Za-z0-9_.-]", "-", state.name).lstrip("._-")
    )
    return check_name(chosen or "local")


def save_up_context(ctx: ClientContext, state: Path, name: str | None = None) -> str:
    """``karios up``: its context under its name (two systems on one machine each keep theirs)
    and as the default one (plain ``karios jobs`` talks to the system started last). Returns a
    phrase for its start-up banner."""
    chosen = up_context_name(state, name)
    default = save_context(ctx, context_path())
    if chosen == DEFAULT:
        return f"context in {default}"
    named = save_context(ctx, name=chosen)
    return f"context in {default}; --context {chosen}: {named}"
