"""The CLI for day-2 work (issue 26 item 4), without a gateway: full ids in a pipe, short ones on a
terminal, reasons never cut, ``jobs --watch`` following new jobs with their own elapsed time,
``--until`` and ``--since`` validated, help and usage lines on every verb, named contexts, the
README's ``karios …`` examples parsed by the CLI itself."""

from __future__ import annotations

import io
import json
import re
import stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import typer
from rich.console import Console

from karios.cli.client import watch as watch_mod
from karios.cli.client.api import CliError
from karios.cli.client.commands import parse_since, resolve_job
from karios.cli.client.context import ClientContext, load_context, save_context, save_up_context
from karios.cli.client.shared import STATE, print_table, table
from karios.cli.client.sse import SseEvent
from karios.cli.client.watch import JobLine, check_until, job_table, watch_jobs
from karios.cli.main import app, main
from tests.fixtures.cli import readme_client_examples

JOB = "345796ee-c24d-4f3a-9a57-5be1d0c2a111"
REASON = (
    "Building media: installer for Debian 12 not found at "
    "/usr/lib/debian-installer/images/12/amd64/text/debian-installer/amd64/linux (apt install "
    "debian-installer-12-netboot-amd64)"
)


def _console(terminal: bool, width: int = 80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=terminal, color_system=None, highlight=False), buf


@pytest.fixture(autouse=True)
def _output_state() -> Iterator[None]:
    saved = dict(STATE)
    STATE.update(output="table", context=None)
    yield
    STATE.clear()
    STATE.update(saved)


# --- ids and reasons in tables ---------------------------------------------------------------


def test_a_pipe_gets_full_ids_and_uncut_cells_at_80_columns():
    con, buf = _console(terminal=False)
    rows = [{"job_id": JOB, "bmc_ip": "192.0.2.11", "message": REASON}]
    print_table(table("jobs", rows, ["job_id", "bmc_ip", "message"], con), con)
    out = buf.getvalue()
    assert JOB in out and REASON in out, out
    assert "…" not in out


def test_a_terminal_gets_short_ids_and_folded_text_and_wide_gets_full_ids():
    con, buf = _console(terminal=True)
    rows = [{"job_id": JOB, "message": REASON}]
    print_table(table("jobs", rows, ["job_id", "message"], con), con)
    out = buf.getvalue()
    assert JOB[:8] in out and JOB not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # folded, never cut with an ellipsis
    assert "".join(c for c in out if c.isalnum()).count("debianinstaller12netbootamd64") == 1

    STATE["output"] = "wide"
    con, buf = _console(terminal=True)
    print_table(table("jobs", rows, ["job_id", "message"], con), con)
    assert JOB in buf.getvalue() and REASON in buf.getvalue()


def test_the_watch_summary_wraps_the_failure_reason_on_a_terminal():
    j = JobLine(JOB, bmc_ip="192.0.2.11", state="failed", status="failed", stage="Failed", message=REASON)
    con, buf = _console(terminal=True)
    print_table(job_table([j], con), con)
    flat = re.sub(r"[\s│┃|]", "", buf.getvalue())
    assert re.sub(r"\s", "", REASON) in flat, buf.getvalue()
    assert "…" not in buf.getvalue()


def test_a_failed_line_says_the_reason_not_only_failed():
    j = JobLine(JOB, state="failed", status="failed", stage="Failed", message=REASON)
    assert j.detail == f"Failed: {REASON}"
    ok = JobLine(JOB, state="booting", stage="Booting", message="Booting the installer")
    assert ok.detail == "Booting"
    # While installing, the installer's step: each stage shows in the watch, not only "Installing OS".
    step = JobLine(JOB, state="installing", stage="Installing OS", message="Partitioning disks: running")
    assert step.detail == "Partitioning disks: running"


# --- --watch ---------------------------------------------------------------------------------


class FakeApi:
    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs
        self.reads: dict[str, int] = {}
        self._lags: dict[str, tuple[int, dict[str, Any]]] = {}

    def lag(self, jid: str, reads: int, then: dict[str, Any]) -> None:
        """The job's view takes `then`'s fields only after `reads` more reads (a read model
        that follows the event stream)."""
        self._lags[jid] = (self.reads.get(jid, 0) + reads, then)

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        jid = path.rsplit("/", 1)[-1]
        if jid not in self.jobs:
            raise CliError("404", status=404)
        self.reads[jid] = self.reads.get(jid, 0) + 1
        after, then = self._lags.get(jid, (0, {}))
        if then and self.reads[jid] > after:
            self.jobs[jid] = {**self.jobs[jid], **then}
        return self.jobs[jid]


def _iso(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat()


def test_jobs_watch_follows_a_job_created_after_it_started_with_its_own_elapsed(monkeypatch):
    old, new = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
    api = FakeApi(
        {
            old: {"id": old, "bmc_ip": "192.0.2.11", "job_status": "booting", "status": "running",
                  "progress": 30, "created_at": _iso(600)},
            new: {"id": new, "bmc_ip": "192.0.2.12", "job_status": "queued", "status": "running",
                  "progress": 0, "created_at": _iso(5)},
        }
    )  # fmt: skip
    seen: dict[str, Any] = {}

    def fake_stream(
        _api: Any, channels: list[str], *, on_connect: Any, stop: Any, **_: Any
    ) -> Iterator[SseEvent]:
        seen["channels"] = channels
        on_connect()
        at = _iso(0)
        yield SseEvent(
            1,
            "job_queued",
            {
                "time": at,
                "data": {"job_id": new, "bmc_ip": "192.0.2.12", "state": "queued", "status": "running"},
            },
        )
        yield SseEvent(
            2,
            "job_failed",
            {
                "time": at,
                "data": {
                    "job_id": new,
                    "bmc_ip": "192.0.2.12",
                    "state": "failed",
                    "status": "failed",
                    "stage": "Failed",
                    "message": REASON,
                },
            },
        )
        assert not stop()  # jobs --watch keeps following until Ctrl-C
        raise KeyboardInterrupt  # fmt: skip

    monkeypatch.setattr(watch_mod, "stream", fake_stream)
    con, buf = _console(terminal=False)
    rc = watch_jobs(api, [old], con, follow_new=True)  # type: ignore[arg-type]
    out = buf.getvalue()
    assert seen["channels"] == ["provision"]
    assert rc == 1  # a followed job failed
    assert new in out and old in out  # full ids in a pipe
    failed = next(line for line in out.splitlines() if new in line and "failed" in line)
    assert REASON in failed, failed  # the per-line output says why, on one line
    old_line = next(line for line in out.splitlines() if old in line and "booting" in line)
    elapsed = float(re.search(r"(\d+\.\d)s", old_line).group(1))  # type: ignore[union-attr]
    assert 595 <= elapsed <= 700, old_line  # from the job's own start, not the watch's
    assert REASON in out.split("jobs")[-1]  # and the summary keeps it whole


def test_a_single_job_watch_says_why_it_is_stuck_and_ends_with_the_job(monkeypatch):
    api = FakeApi({JOB: {"id": JOB, "bmc_ip": "192.0.2.11", "job_status": "installing", "status": "running",
                         "created_at": _iso(30)}})  # fmt: skip

    def fake_stream(
        _api: Any, channels: list[str], *, on_connect: Any, stop: Any, **_: Any
    ) -> Iterator[SseEvent]:
        assert channels == [f"job:{JOB}"]
        on_connect()
        yield SseEvent(
            3,
            "job_stuck",
            {
                "data": {
                    "job_id": JOB,
                    "state": "stuck",
                    "status": "stuck",
                    "stage": "Stuck",
                    "message": "no installer report for 1800 s",
                }
            },
        )
        assert not stop()  # stuck is no end: the installer may report again
        yield SseEvent(
            4,
            "job_failed",
            {
                "data": {
                    "job_id": JOB,
                    "state": "failed",
                    "status": "failed",
                    "stage": "Failed",
                    "message": "cancelled by the stuck sweep",
                }
            },
        )
        assert stop()  # fmt: skip

    monkeypatch.setattr(watch_mod, "stream", fake_stream)
    con, buf = _console(terminal=False)
    api.lag(JOB, reads=2, then={"status": "failed", "job_status": "failed"})  # the read model follows
    assert watch_jobs(api, [JOB], con) == 1  # type: ignore[arg-type]
    assert "Stuck: no installer report for 1800 s" in buf.getvalue()
    assert "Failed: cancelled by the stuck sweep" in buf.getvalue()
    assert api.get(f"/controlnode/job/{JOB}")["status"] == "failed"  # the watch ended once it agreed


def _ending_stream(status: str) -> Any:
    def fake_stream(
        _api: Any, channels: list[str], *, on_connect: Any, stop: Any, **_: Any
    ) -> Iterator[SseEvent]:
        on_connect()
        yield SseEvent(9, f"job_{status}", {"data": {"job_id": JOB, "state": status, "status": status}})
        assert stop()

    return fake_stream


def test_a_watch_ends_only_once_the_job_view_says_what_its_last_event_said(monkeypatch):
    """`karios provision --watch && karios job show` never reads "running" after the watch said
    "completed": the watch reads the job view (the gateway's read model, a moment behind the
    event stream) until it agrees."""
    api = FakeApi({JOB: {"id": JOB, "bmc_ip": "192.0.2.11", "job_status": "first_boot", "status": "running"}})
    api.lag(JOB, reads=5, then={"status": "completed", "job_status": "completed"})
    monkeypatch.setattr(watch_mod, "stream", _ending_stream("completed"))
    con, buf = _console(terminal=False)
    assert watch_jobs(api, [JOB], con) == 0  # type: ignore[arg-type]
    assert api.reads[JOB] >= 6  # read until it agreed ...
    assert api.get(f"/controlnode/job/{JOB}")["status"] == "completed"  # ... which it now does
    assert "does not say" not in buf.getvalue()


def test_a_job_view_that_never_agrees_is_said_and_the_events_outcome_kept(monkeypatch):
    api = FakeApi({JOB: {"id": JOB, "bmc_ip": "192.0.2.11", "job_status": "first_boot", "status": "running"}})
    monkeypatch.setattr(watch_mod, "stream", _ending_stream("completed"))
    con, buf = _console(terminal=False)
    started = time.monotonic()
    assert watch_jobs(api, [JOB], con, settle_timeout=0.5) == 0  # type: ignore[arg-type]
    assert 0.4 <= time.monotonic() - started < 5  # bounded by the timeout
    said = " ".join(buf.getvalue().split())
    assert f"job {JOB}: the gateway's job view does not say 'completed' yet" in said, said


def test_a_watch_until_a_state_agrees_with_a_view_at_that_state_or_past_it():
    line = JobLine(JOB, state="booting")
    assert watch_mod.agrees({"status": "running", "job_status": "installing"}, line, "booting")
    assert watch_mod.agrees({"status": "completed", "job_status": "completed"}, line, "booting")
    assert not watch_mod.agrees({"status": "running", "job_status": "mounting"}, line, "booting")
    line.status = "failed"
    assert not watch_mod.agrees({"status": "running", "job_status": "installing"}, line, None)
    assert watch_mod.agrees({"status": "failed", "job_status": "failed"}, line, None)


def test_until_must_be_a_state_the_job_passes_through():
    assert check_until("booting") == "booting" and check_until("") is None
    with pytest.raises(CliError) as err:
        check_until("bogus")
    assert err.value.code == 2 and "queued, building_media" in err.value.message


def test_until_bogus_is_a_usage_error_before_any_call(capsys, monkeypatch):
    monkeypatch.setenv("KARIOS_URL", "http://127.0.0.1:9")
    assert main(["provision", "192.0.2.11", "--watch", "--until", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "'bogus' is not a job state" in err and "booting" in err and "cannot reach" not in err


def test_since_takes_durations_and_iso_times_and_refuses_the_rest():
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    assert parse_since("2h", now) == now - timedelta(hours=2)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("1w", now) == now - timedelta(weeks=1)
    assert parse_since("2026-12-01T08:00:00Z") == datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert parse_since("2026-12-01").tzinfo is not None
    with pytest.raises(CliError) as err:
        parse_since("yesterday")
    assert err.value.code == 2


def test_watch_with_history_filters_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("KARIOS_URL", "http://127.0.0.1:9")
    assert main(["jobs", "--watch", "--all"]) == 2
    assert "does not go with --all" in capsys.readouterr().err


# --- prefix lookup ---------------------------------------------------------------------------


class PrefixApi:
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def get(self, path: str, params: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        assert path == "/controlnode/jobs"
        prefix = (params or {})["id_prefix"]
        hits = [i for i in self.ids if i.startswith(prefix)]
        items = [{"id": i, "bmc_ip": "192.0.2.11", "job_type": "provision", "status": "failed",
                  "created_at": "2026-12-04T10:00:00+00:00"} for i in hits[: params["limit"]]]  # fmt: skip
        return {"items": items, "total": len(hits)}


def test_a_unique_prefix_resolves_an_ambiguous_one_lists_candidates_none_is_404():
    a = PrefixApi([JOB, "345796ff-0000-4000-8000-000000000000", "9a000000-0000-4000-8000-000000000000"])
    assert resolve_job(a, "9a") == "9a000000-0000-4000-8000-000000000000"  # type: ignore[arg-type]
    assert resolve_job(a, JOB) == JOB  # type: ignore[arg-type]
    with pytest.raises(CliError) as err:
        resolve_job(a, "3457")  # type: ignore[arg-type]
    assert "ambiguous" in err.value.message and JOB in err.value.message
    assert "345796ff-0000-4000-8000-000000000000" in err.value.message and err.value.code == 1
    with pytest.raises(CliError) as err:
        resolve_job(a, "dead")  # type: ignore[arg-type]
    assert "no job 'dead' (404)" in err.value.message and err.value.status == 404


# --- help and usage --------------------------------------------------------------------------


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))


def test_every_verb_has_help_and_no_usage_line_reads_braces():
    root = typer.main.get_command(app)
    found = list(_commands(root))
    assert len(found) > 25
    for path, cmd in found:
        assert (cmd.help or "").strip(), f"karios {' '.join(path)} has no help text"
        ctx = cmd.make_context(" ".join(("karios", *path)), ["--help"], resilient_parsing=True)
        usage = cmd.get_usage(ctx)
        assert "{" not in usage and "}" not in usage, usage


def test_a_group_help_names_only_subcommands_that_exist():
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        if not hasattr(cmd, "commands"):
            continue
        listed = (cmd.help or "").split(":", 1)[-1]
        words = re.findall(r"\b([a-z]+)\b(?![^(]*\))", listed.split("(needs")[0])
        for word in words:
            assert word in cmd.commands, f"`karios {name} --help` names {word!r}, which is no subcommand"
    assert "list" in root.commands["nodes"].commands


# --- contexts --------------------------------------------------------------------------------


def test_named_contexts_coexist_with_the_default_file_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for var in ("KARIOS_CONFIG", "KARIOS_URL", "KARIOS_TOKEN", "KARIOS_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    default = save_context(ClientContext(url="http://one:8080", token="kt_one"))
    assert default == tmp_path / "karios" / "config.json"
    lab = save_context(ClientContext(url="http://two:8080", token="kt_two"), name="lab2")
    assert lab == tmp_path / "karios" / "contexts" / "lab2.json"
    for p in (default, lab):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert load_context().url == "http://one:8080"
    assert load_context("lab2").token == "kt_two"
    monkeypatch.setenv("KARIOS_CONTEXT", "lab2")
    assert load_context().url == "http://two:8080"
    with pytest.raises(CliError) as err:
        load_context("nope")
    assert err.value.code == 2 and "known: default, lab2" in err.value.message
    with pytest.raises(CliError):
        load_context("../etc")


def test_karios_up_writes_its_context_under_its_state_dirs_name_and_as_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KARIOS_CONFIG", str(tmp_path / "cfg" / "config.json"))
    monkeypatch.delenv("KARIOS_CONTEXT", raising=False)
    save_up_context(ClientContext(url="http://127.0.0.1:8080", token="kt_a"), tmp_path / "karios")
    said = save_up_context(ClientContext(url="http://127.0.0.1:9080", token="kt_b"), tmp_path / "demo")
    assert "--context demo" in said
    ctxs = tmp_path / "cfg" / "contexts"
    assert json.loads((ctxs / "karios.json").read_text())["url"] == "http://127.0.0.1:8080"
    assert json.loads((ctxs / "demo.json").read_text())["url"] == "http://127.0.0.1:9080"
    assert json.loads((tmp_path / "cfg" / "config.json").read_text())["token"] == "kt_b"  # the last one
    save_up_context(ClientContext(url="http://x", token="kt_c"), tmp_path / "whatever", "prod")
    assert stat.S_IMODE((ctxs / "prod.json").stat().st_mode) == 0o600


def test_context_flag_selects_the_gateway(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KARIOS_CONFIG", str(tmp_path / "config.json"))
    for var in ("KARIOS_URL", "KARIOS_TOKEN", "KARIOS_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    save_context(ClientContext(url="http://127.0.0.1:9", token="kt_x"), name="dead")
    assert main(["--context", "dead", "jobs"]) == 2
    assert "cannot reach the gateway at http://127.0.0.1:9" in capsys.readouterr().err
    assert main(["--context", "missing", "jobs"]) == 2
    assert "no context 'missing'" in capsys.readouterr().err


# --- the README's examples -------------------------------------------------------------------


def test_the_readme_examples_parse_with_the_clis_own_parser(monkeypatch, capsys):
    """Each example gets past the CLI's parser to its first gateway call (none is reachable here:
    exit 2 naming the gateway), never a usage error."""
    examples = readme_client_examples()
    verbs = {tuple(e[:2]) for e in examples}
    assert {("fabric", "plan"), ("fabric", "preflight"), ("job", "show"), ("jobs", "--watch")} <= verbs
    monkeypatch.setenv("KARIOS_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KARIOS_CONFIG", "/nonexistent/karios.json")
    monkeypatch.delenv("KARIOS_CONTEXT", raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    for argv in examples:
        argv = [a.replace("JOB_ID", JOB) for a in argv]
        code = main(argv)
        err = capsys.readouterr().err
        assert "Usage:" not in err and "Error" not in err, (argv, err)
        reached = err.startswith("karios: cannot reach the gateway at http://127.0.0.1:9 ")
        local = "context" in argv  # reads the context file only
        assert (
            (code == 2 and reached)
            or (local and code == 0)
            or (argv[:2] == ["fabric", "teardown"] and code == 1)
        ), (
            argv,
            code,
            err,
        )


# --- karios up --timeout -----------------------------------------------------------------------


def test_not_ready_in_time_names_the_timeout_option(tmp_path, capsys):
    from types import SimpleNamespace

    from karios.cli.supervisor import Child
    from karios.cli.up import Up

    child = Child("api-gateway", ["true"], tmp_path / "api-gateway.log", "http://127.0.0.1:9/readyz")
    up = Up.__new__(Up)  # only what _wait_all_ready reads
    up.args = SimpleNamespace(timeout=0.0)
    up.sup = SimpleNamespace(children={"api-gateway": child}, poll=lambda: None)
    up.nats_sup = up.embedded = SimpleNamespace(children={}, poll=lambda: None)  # the servers: up
    assert up._wait_all_ready({"api-gateway": "http://127.0.0.1:9"}) is False
    err = capsys.readouterr().err
    assert "not ready in 0 s" in err and "--timeout 300" in err, err
