"""The template set being served, and the git sync that replaces it.

The whole set (catalog + every template source) is parsed into memory before it is
published, so a swap is one reference assignment: a request renders with either the old
set or the new one, never a mix. A set that fails to parse is counted and dropped; the
last good set stays in service.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from karios.bootapi.metrics import BootapiMetrics
from karios.common.oscatalog import TemplateSet, TemplateSetError, load_template_set
from karios.common.tasks import cancel_and_wait
from karios.common.telemetry import get_logger

log = get_logger(__name__)


def redact_url(url: str) -> str:
    """``https://user:secret@host/x`` → ``https://***@host/x`` (git URLs may carry credentials)."""
    return re.sub(r"//[^/@]+@", "//***@", url)


@dataclass
class TemplateStore:
    metrics: BootapiMetrics
    current: TemplateSet | None = None
    generation: int = 0
    last_error: str = ""

    def publish(self, templates: TemplateSet) -> int:
        self.current = templates
        self.generation += 1
        self.last_error = ""
        self.metrics.template_generation.set(self.generation)
        return self.generation

    @property
    def ready(self) -> bool:
        return self.current is not None

    def get(self) -> TemplateSet:
        if self.current is None:
            raise RuntimeError("no template set loaded")
        return self.current


class GitError(RuntimeError):
    pass


@dataclass
class GitTemplateSync:
    """Clone ``url`` once, then fetch + hard reset every ``interval`` seconds."""

    url: str
    store: TemplateStore
    interval: float = 180.0
    ref: str = ""
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bootapi-templates-")))
    timeout: float = 60.0
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    @property
    def checkout(self) -> Path:
        return self.workdir / "repo"

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
        try:
            proc = subprocess.run(
                ["git", *args],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GitError(f"git {args[0]} timed out after {self.timeout:.0f}s") from None
        if proc.returncode != 0:
            raise GitError(f"git {args[0]} failed: {redact_url(proc.stderr.strip())[-500:]}")
        return proc.stdout.strip()

    def _pull(self) -> str:
        """Bring the checkout to the remote's tip; returns the commit id."""
        if not (self.checkout / ".git").is_dir():
            shutil.rmtree(self.checkout, ignore_errors=True)
            branch = ["--branch", self.ref] if self.ref else []
            self._git("clone", "--quiet", "--depth", "1", *branch, self.url, str(self.checkout))
        else:
            self._git("fetch", "--quiet", "--depth", "1", "origin", self.ref or "HEAD", cwd=self.checkout)
            self._git("reset", "--quiet", "--hard", "FETCH_HEAD", cwd=self.checkout)
            self._git("clean", "-qfdx", cwd=self.checkout)
        return self._git("rev-parse", "HEAD", cwd=self.checkout)

    def sync_once(self) -> bool:
        """One pull + parse; True when a new generation was published. Blocking: run in a thread."""
        m = self.store.metrics
        m.template_sync.inc()
        try:
            revision = self._pull()
            current = self.store.current
            if (
                current is not None
                and current.revision == revision
                and current.origin == redact_url(self.url)
            ):
                return False
            templates = load_template_set(self.checkout, origin=redact_url(self.url), revision=revision)
        except (GitError, TemplateSetError, OSError) as exc:
            m.template_sync_failures.inc()
            self.store.last_error = str(exc)
            log.warning(
                "template sync failed; keeping the last good set",
                repo=redact_url(self.url),
                error=str(exc),
                generation=self.store.generation,
            )
            return False
        generation = self.store.publish(templates)
        log.info("template set updated", repo=redact_url(self.url), revision=revision, generation=generation)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sync_once)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="bootapi-template-sync")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        shutil.rmtree(self.workdir, ignore_errors=True)
