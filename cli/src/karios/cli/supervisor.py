"""Supervision for ``karios up``: restart a crashed service with backoff, give up on a crash loop.

- :class:`CrashPolicy` is the pure rule: the delay before the next restart (doubling from
  ``first_delay`` to ``max_delay``) and when to give up (``max_crashes`` within ``window``
  seconds). Crashes older than the window are forgotten, so a service that crashes once a day
  is restarted forever.
- :class:`Supervisor` owns the child processes: it notices an exit, says so on the console and
  in the service's log and ``karios.log``, restarts it after the delay, reports when its
  ``/readyz`` is green again, and stops everything only when asked (or on a crash loop).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from karios.cli.readiness import probe
from karios.common.instance import INSTANCE_ENV


@dataclass
class CrashPolicy:
    """When to restart a crashed service and when to give up (pure: the clock is passed in)."""

    max_crashes: int = 5
    window: float = 60.0
    first_delay: float = 0.5
    max_delay: float = 10.0
    _crashes: deque[float] = field(default_factory=deque, init=False)

    def crashed(self, now: float) -> float | None:
        """Record a crash at ``now``; the delay before restarting, or ``None`` to give up."""
        self._crashes.append(now)
        while self._crashes and self._crashes[0] <= now - self.window:
            self._crashes.popleft()
        if len(self._crashes) >= self.max_crashes:
            return None
        return min(self.max_delay, self.first_delay * 2 ** (len(self._crashes) - 1))

    @property
    def recent(self) -> int:
        return len(self._crashes)


@dataclass
class Child:
    """One supervised service: how to start it, where it logs, its readiness URL."""

    name: str
    argv: list[str]
    log_path: Path
    ready_url: str
    policy: CrashPolicy = field(default_factory=CrashPolicy)
    #: Settings of this child only, over the supervisor's environment (a replica's own port).
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    down_since: float | None = None
    starts: int = 0
    #: This start's ``KARIOS_INSTANCE_ID``: readiness counts only this process's answer.
    instance: str = ""


class CrashLoop(RuntimeError):
    """A service crashed ``max_crashes`` times within ``window`` seconds."""


@dataclass
class Supervisor:
    env: dict[str, str]
    log_dir: Path
    preexec: Callable[[], None] | None = None
    console: IO[str] = field(default_factory=lambda: sys.stderr)
    children: dict[str, Child] = field(default_factory=dict)

    def add(self, child: Child) -> None:
        self.children[child.name] = child

    def start_all(self) -> None:
        for child in self.children.values():
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        out = open(child.log_path, "ab")  # noqa: SIM115 (handed to the child; closed below)
        child.instance = uuid.uuid4().hex
        env = {**self.env, **child.env, INSTANCE_ENV: child.instance}
        try:
            child.proc = subprocess.Popen(
                child.argv, env=env, stdout=out, stderr=out, preexec_fn=self.preexec
            )
        finally:
            out.close()  # the child holds its own descriptor
        child.starts += 1
        child.restart_at = None

    def say(self, child: Child | None, message: str) -> None:
        """One line on the console, in ``karios.log`` and (for a service) in its own log."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(f"karios: {message}", file=self.console, flush=True)
        paths = [self.log_dir / "karios.log"] + ([child.log_path] if child else [])
        for path in paths:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{stamp} karios supervisor: {message}\n")

    def poll(self, now: float | None = None) -> None:
        """One supervision step: notice exits, restart when due, report readiness regained.

        Raises :class:`CrashLoop` when a service has crashed too often to keep trying.
        """
        now = time.monotonic() if now is None else now
        for child in self.children.values():
            if child.proc is not None and child.restart_at is None and child.proc.poll() is not None:
                self._on_exit(child, now)
            if child.restart_at is not None and now >= child.restart_at:
                self._spawn(child)
                assert child.proc is not None
                self.say(child, f"{child.name} restarted (pid {child.proc.pid}, start {child.starts})")
            if (
                child.down_since is not None
                and child.restart_at is None
                and is_ready(child.ready_url, instance=child.instance)
            ):
                self.say(child, f"{child.name} ready again after {now - child.down_since:.1f} s down")
                child.down_since = None

    def _on_exit(self, child: Child, now: float) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        delay = child.policy.crashed(now)
        if delay is None:
            self.say(
                child,
                f"{child.name} crashed {child.policy.max_crashes} times within "
                f"{child.policy.window:.0f} s (last exit code {code}); giving up — "
                f"see {child.log_path}",
            )
            raise CrashLoop(child.name)
        self.say(
            child,
            f"{child.name} exited with code {code}; restarting in {delay:.1f} s "
            f"(crash {child.policy.recent} of {child.policy.max_crashes} allowed within "
            f"{child.policy.window:.0f} s)",
        )
        child.restart_at = now + delay
        if child.down_since is None:
            child.down_since = now

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every service's process group, SIGKILL what is left after ``grace`` seconds."""
        live = [c.proc for c in self.children.values() if c.proc is not None and c.proc.poll() is None]
        for p in live:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait(5)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


def is_ready(url: str, timeout: float = 0.5, instance: str = "") -> bool:
    """Whether the service's readiness URL answers 200 now (no answer counts as not ready); with
    `instance`, only that process's answer counts (see :func:`karios.cli.readiness.probe`)."""
    return probe(url, timeout, instance)[0]
