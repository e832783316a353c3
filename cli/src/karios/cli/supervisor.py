"""Supervision for ``karios up``: restart a crashed service with backoff, give up on a crash loop.

- :class:`CrashPolicy` is the pure rule: the delay before the next restart (doubling from
  ``first_delay`` to ``max_delay``) and when to give up (``max_crashes`` within ``window``
  seconds). Crashes older than the window are forgotten, so a service that crashes once a day
  is restarted forever.
- :class:`Supervisor` owns the child processes: it notices an exit (and reaps it: no zombie),
  says so on the console and in the service's log and ``karios.log``, restarts it after the
  delay, reports when its ``/readyz`` is green again, and stops everything only when asked (or on
  a crash loop). The embedded NATS and PostgreSQL are children too: a :class:`Child` may bring
  its own way to start (``spawn``) and to tell it is ready (``ready``).
- :func:`fork_process` starts a service as a fork of ``karios up`` itself, which imported the
  services' code once (:func:`karios.cli.runservice.preload`): a service's start (and restart)
  costs what it does after its imports, not the imports again (~80 % of its start-up CPU). The
  child looks like ``karios run <service>`` (its command line, environment, log, process group
  and parent-death signal) and exits as that process would.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
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
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None
    #: Run in a fork of this process instead of ``argv`` (the service's code already imported).
    fork: Callable[[], None] | None = None
    restart_at: float | None = None
    down_since: float | None = None
    starts: int = 0
    #: This start's ``KARIOS_INSTANCE_ID``: readiness counts only this process's answer.
    instance: str = ""
    #: How to start it, instead of ``argv`` with the supervisor's environment (an embedded
    #: server: same ports and data directory on every start). May raise :class:`NotNow`.
    spawn: Callable[[], subprocess.Popen[bytes]] | None = None
    #: Whether it is ready now, instead of ``ready_url`` answering 200 with its instance id.
    ready: Callable[[], bool] | None = None
    #: What :class:`NotNow` said last (said once, not on every retry).
    waiting: str = ""

    def is_ready(self) -> bool:
        if self.ready is not None:
            return self.ready()
        return is_ready(self.ready_url, instance=self.instance)


class NotNow(RuntimeError):
    """A child cannot start now, for a reason that is not its fault (an embedded PostgreSQL
    restarted by hand serves the data directory): not a crash; tried again after ``retry_in``."""

    def __init__(self, message: str, retry_in: float = 2.0) -> None:
        super().__init__(message)
        self.retry_in = retry_in


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
        if child.spawn is not None:
            child.proc = child.spawn()
            child.starts += 1
            child.restart_at = None
            return
        out = open(child.log_path, "ab")  # noqa: SIM115 (handed to the child; closed below)
        child.instance = uuid.uuid4().hex
        env = {**self.env, **child.env, INSTANCE_ENV: child.instance}
        try:
            if child.fork is not None:
                child.proc = fork_process(child.fork, child.argv, env, out.fileno(), self.preexec)
            else:
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
            if child.restart_at is not None and now >= child.restart_at and not self._restart(child, now):
                continue
            if child.down_since is not None and child.restart_at is None and child.is_ready():
                self.say(child, f"{child.name} ready again after {now - child.down_since:.1f} s down")
                child.down_since = None

    def _restart(self, child: Child, now: float) -> bool:
        """Start a child again; whether it runs (else it waits, or failed to start: a crash)."""
        try:
            self._spawn(child)
        except NotNow as exc:
            if str(exc) != child.waiting:
                self.say(child, str(exc))
                child.waiting = str(exc)
            child.restart_at = now + exc.retry_in
            return False
        except Exception as exc:  # e.g. a data directory it cannot take over
            child.restart_at = None
            self._on_exit(child, now, f"failed to start ({exc})")
            return False
        child.waiting = ""
        assert child.proc is not None
        self.say(child, f"{child.name} restarted (pid {child.proc.pid}, start {child.starts})")
        return True

    def _on_exit(self, child: Child, now: float, how: str = "") -> None:
        assert child.proc is not None
        code = child.proc.returncode
        how = how or f"exited with code {code}"
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
            f"{child.name} {how}; restarting in {delay:.1f} s "
            f"(crash {child.policy.recent} of {child.policy.max_crashes} allowed within "
            f"{child.policy.window:.0f} s)",
        )
        child.restart_at = now + delay
        if child.down_since is None:
            child.down_since = now

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every service's process group (each drains: its bus and database are still up,
        ``karios up`` stops those after this returns), SIGKILL what is left after ``grace``
        seconds — said on the console and in the logs, since that child did not drain."""
        live = [c for c in self.children.values() if c.proc is not None and c.proc.poll() is None]
        for c in live:
            assert c.proc is not None
            _signal_group(c.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in live:
            assert c.proc is not None
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(c, f"{c.name} did not stop within {grace:.0f} s of SIGTERM; killed")
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait(5)


class ForkedProcess:
    """A forked child as :class:`subprocess.Popen` shows one: ``pid``, ``returncode`` (negative:
    the signal that ended it), ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, pid: int, argv: list[str]) -> None:
        self.pid, self.args = pid, argv
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its status unknown
                self.returncode = 255
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_process(
    target: Callable[[], None],
    argv: list[str],
    env: dict[str, str],
    out: int,
    preexec: Callable[[], None] | None = None,
) -> ForkedProcess:
    """Run ``target()`` in a forked child as if ``argv`` had been started with ``env``: stdin
    from /dev/null, stdout and stderr to the descriptor ``out``, no other descriptor of this
    process, ``preexec`` run first (process group, parent-death signal), its command line shown as
    ``argv`` (``ps``, psutil), then the process's exit status: 0, ``sys.exit``'s, 1 with the
    traceback on stderr. Call it from a single-threaded process (``karios up``'s main thread)."""
    set_title = _title_setter()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid, argv)
    code = 1
    try:  # the child: never returns into the caller's frames
        # Objects of the parent stay as they are: no collection (no finaliser closing a descriptor
        # that is now another's) and fewer pages copied on write.
        gc.freeze()
        atexit._clear()  # the parent's exit handlers are the parent's (its embedded servers)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if preexec is not None:
            preexec()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, _max_fd())
        # Python's own streams on the new descriptors (the parent's may be another object).
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", 1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        # As Python sets it for `python -m karios.cli run X` (this process was `-m karios.cli up`).
        sys.argv = [sys.argv[0], *argv[3:]] if argv[1:2] == ["-m"] else argv[1:]
        set_title(argv)
        target()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # the child's own (its telemetry's flush)
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def _title_setter() -> Callable[[list[str]], None]:
    """How the child shows ``argv`` as its command line (``ps``, psutil) with setproctitle, its
    short name staying the interpreter's, as for a started ``argv``. Imported in the parent:
    setproctitle finds the command line's memory through the environment it started with
    (then the parent's command line reads as one string, which psutil splits at its spaces)."""
    try:
        from setproctitle import getproctitle, getthreadtitle, setproctitle, setthreadtitle
    except ImportError:  # without it the command line stays the parent's
        return lambda argv: None
    getproctitle()  # its set-up, while the environment is the one the process started with

    def set_title(argv: list[str]) -> None:
        name = getthreadtitle()
        setproctitle(" ".join(argv))
        setthreadtitle(name)

    return set_title


def _signal_group(p: subprocess.Popen[bytes] | ForkedProcess, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)


def is_ready(url: str, timeout: float = 0.5, instance: str = "") -> bool:
    """Whether the service's readiness URL answers 200 now (no answer counts as not ready); with
    `instance`, only that process's answer counts (see :func:`karios.cli.readiness.probe`)."""
    return probe(url, timeout, instance)[0]
