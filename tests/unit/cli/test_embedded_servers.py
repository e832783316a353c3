"""The rules behind the supervised embedded servers of ``karios up`` (no servers started here):
the JetStream space check at start, the event stream's configurable size, and the supervisor's
``spawn`` / ``ready`` / :class:`NotNow` hooks the embedded NATS and PostgreSQL use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from karios.cli.embedded import jetstream_space_problem
from karios.cli.supervisor import Child, CrashLoop, CrashPolicy, NotNow, Supervisor
from karios.common.bus.streams import EVT_MAX_BYTES, stream_configs
from karios.common.bus.subjects import Subjects
from karios.common.settings import KariosSettings

MIB = 1 << 20


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(os, "statvfs", lambda _p: SimpleNamespace(f_bavail=free // 4096, f_frsize=4096))


def test_a_new_event_stream_larger_than_three_quarters_of_the_free_space_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "nats" / "jetstream"  # not created yet: the check climbs to what exists
    _free(monkeypatch, 128 * MIB)
    problem = jetstream_space_problem(store, {"KARIOS_CMD": 0, "KARIOS_EVT": 1 << 30})
    assert problem is not None
    assert "128.0 MiB free, of which NATS uses 75% (96.0 MiB); KARIOS_EVT reserves 1.0 GiB" in problem
    assert "Lower KARIOS_BUS_EVENTS_MAX_BYTES (e.g. KARIOS_BUS_EVENTS_MAX_BYTES=48MiB)" in problem
    # The suggestion fits; so does anything up to 75 %.
    assert jetstream_space_problem(store, {"KARIOS_EVT": 48 * MIB}) is None
    assert jetstream_space_problem(store, {"KARIOS_EVT": 96 * MIB}) is None


def test_a_stream_already_in_the_store_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nats-server keeps a stream it has on disk whatever its limit (its data already took space).
    (tmp_path / "jetstream" / "$G" / "streams" / "KARIOS_EVT").mkdir(parents=True)
    _free(monkeypatch, 10 * MIB)
    assert jetstream_space_problem(tmp_path, {"KARIOS_EVT": 1 << 30}) is None


def test_the_event_stream_size_is_a_setting_with_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KARIOS_BUS_EVENTS_MAX_BYTES", raising=False)
    dev = {"_env_file": None, "dev_mode": True}
    assert KariosSettings(**dev).bus_events_max_bytes == EVT_MAX_BYTES
    monkeypatch.setenv("KARIOS_BUS_EVENTS_MAX_BYTES", "256MiB")
    assert KariosSettings(**dev).bus_events_max_bytes == 256 * MIB
    monkeypatch.setenv("KARIOS_BUS_EVENTS_MAX_BYTES", "0")
    with pytest.raises(ValueError, match="bus_events_max_bytes"):
        KariosSettings(**dev)
    evt = {c.name: c for c in stream_configs(Subjects("karios"), 1, 64 * MIB)}["KARIOS_EVT"]
    assert evt.max_bytes == 64 * MIB


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_child_with_its_own_spawn_and_ready_is_restarted_waits_when_told_and_reports_ready(
    tmp_path: Path,
) -> None:
    console = tmp_path / "console"
    sup = Supervisor(env={}, log_dir=tmp_path, console=open(console, "w"))  # noqa: SIM115
    verdicts: list[object] = []
    ready = {"now": False}

    def spawn() -> subprocess.Popen[bytes]:
        verdict = verdicts.pop(0) if verdicts else None
        if isinstance(verdict, Exception):
            raise verdict
        return _sleeper()

    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    child = Child(
        "postgresql", [], tmp_path / "pg.log", "", CrashPolicy(max_crashes=3, window=60),
        proc=dead, starts=1, spawn=spawn, ready=lambda: ready["now"],
    )  # fmt: skip
    sup.add(child)
    verdicts += [NotNow("postgresql: served by pid 42 started outside karios up", retry_in=5.0)] * 2
    try:
        sup.poll(now=0.0)  # the exit: reaped, a restart in 0.5 s
        assert child.restart_at == 0.5 and child.down_since == 0.0
        sup.poll(now=1.0)  # told to wait: not a crash, said once
        sup.poll(now=6.0)
        assert child.restart_at == 11.0 and child.policy.recent == 1 and child.proc is dead
        sup.poll(now=11.0)  # started
        assert child.proc is not dead and child.starts == 2 and child.restart_at is None
        assert child.down_since == 0.0  # not ready yet
        ready["now"] = True
        sup.poll(now=12.0)
        assert child.down_since is None
    finally:
        if child.proc is not dead:
            child.proc.kill()
            child.proc.wait()
    said = console.read_text()
    assert "postgresql exited with code 3; restarting in 0.5 s" in said
    assert said.count("served by pid 42") == 1
    assert "postgresql restarted (pid" in said and "postgresql ready again after 12.0 s down" in said
    assert "postgresql restarted" in (tmp_path / "pg.log").read_text()  # its own log too


def test_a_child_that_cannot_be_started_counts_as_a_crash(tmp_path: Path) -> None:
    sup = Supervisor(env={}, log_dir=tmp_path, console=open(tmp_path / "console", "w"))  # noqa: SIM115

    def spawn() -> subprocess.Popen[bytes]:
        raise RuntimeError("a leftover postmaster did not stop")

    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    dead.wait()
    child = Child(
        "postgresql", [], tmp_path / "pg.log", "", CrashPolicy(max_crashes=2, window=60),
        proc=dead, starts=1, spawn=spawn,
    )  # fmt: skip
    sup.add(child)
    sup.poll(now=0.0)
    with pytest.raises(CrashLoop):
        sup.poll(now=1.0)
    said = (tmp_path / "console").read_text()
    assert "postgresql crashed 2 times within 60 s" in said and "giving up" in said
