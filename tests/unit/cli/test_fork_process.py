"""``supervisor.fork_process``: a forked child that looks and ends like the started ``argv`` would
(``karios up`` runs its services so) — real forks of the test process."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from karios.cli.supervisor import ForkedProcess, fork_process

ARGV = [sys.executable, "-m", "karios.cli", "run", "inventory"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /proc: Linux")


def _fork(tmp_path: Path, target, env: dict[str, str] | None = None) -> tuple[ForkedProcess, Path]:  # type: ignore[no-untyped-def]
    log = tmp_path / "child.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        proc = fork_process(target, ARGV, env or {"ONLY": "this"}, fd)
    finally:
        os.close(fd)
    return proc, log


def test_the_child_has_its_environment_argv_log_and_no_descriptor_of_the_parent(tmp_path: Path):
    held = os.open(tmp_path / "parent-only", os.O_WRONLY | os.O_CREAT)  # the parent's, not the child's

    def child() -> None:
        alive = []
        for fd in (held, 0):
            try:
                os.fstat(fd)
                alive.append(fd)
            except OSError:
                pass
        print(
            json.dumps(
                {
                    "env": dict(os.environ),
                    "argv": sys.argv[1:],
                    "open": alive,
                    "stdin": os.read(0, 10).decode(),
                }
            )
        )
        print("to stderr", file=sys.stderr)

    try:
        proc, log = _fork(tmp_path, child, {"ONLY": "this", "KARIOS_X": "1"})
        assert proc.wait(30) == 0
    finally:
        os.close(held)
    first, second = log.read_text().splitlines()
    seen = json.loads(first)
    assert seen["env"] == {"ONLY": "this", "KARIOS_X": "1"}  # exactly the given environment
    assert seen["argv"] == ["run", "inventory"]  # as Python sets it for `-m karios.cli run inventory`
    assert seen["open"] == [0] and seen["stdin"] == ""  # stdin is /dev/null; nothing else inherited
    assert second == "to stderr"


def test_the_command_line_shows_the_argv_and_signals_reach_it(tmp_path: Path):
    proc, _ = _fork(tmp_path, lambda: time.sleep(60))
    try:
        deadline = time.monotonic() + 10
        shown: list[str] = []
        while time.monotonic() < deadline:
            shown = " ".join(psutil.Process(proc.pid).cmdline()).split()
            if shown == ARGV:
                break
            time.sleep(0.05)
        assert shown == ARGV
        assert psutil.Process(proc.pid).ppid() == os.getpid()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL  # as Popen says it: the signal, negative
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
    proc.kill()  # a no-op once it has ended


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        ("return", 0, ""),
        ("exit4", 4, ""),
        ("exit-text", 1, "no config"),
        ("raise", 1, "RuntimeError: boom"),
        ("interrupt", 130, ""),
    ],
)
def test_the_exit_status_is_the_one_the_started_process_would_have(
    tmp_path: Path, body: str, code: int, said: str
):
    def child() -> None:
        if body == "exit4":
            sys.exit(4)
        if body == "exit-text":
            sys.exit("no config")
        if body == "raise":
            raise RuntimeError("boom")
        if body == "interrupt":
            raise KeyboardInterrupt

    proc, log = _fork(tmp_path, child)
    assert proc.wait(30) == code
    assert said in log.read_text()
    if body == "raise":
        assert "Traceback" in log.read_text()


def test_exit_handlers_are_the_childs_own_not_the_parents(tmp_path: Path):
    marker = tmp_path / "parent-handler-ran"
    parents = lambda: marker.write_text("ran")  # noqa: E731 (what a parent's handler would do: stop its servers)
    atexit.register(parents)
    try:

        def child() -> None:
            atexit.register(lambda: print("child handler ran", flush=True))

        proc, log = _fork(tmp_path, child)
        assert proc.wait(30) == 0
    finally:
        atexit.unregister(parents)
    assert not marker.exists()
    assert "child handler ran" in log.read_text()
