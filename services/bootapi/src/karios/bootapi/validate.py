"""``bootapi validate DIR``: check a template + catalog set the way the templates repo's CI needs.

Every catalog entry is rendered against a sample host (with and without a provision token):
kickstarts must pass ``ksvalidator`` and ``bash -n`` on every ``%pre``/``%post`` script;
preseeds must pass ``debconf-set-selections --checkonly`` with no warning at all; iPXE
scripts must start with ``#!ipxe``. Output is one line per check, for a CI log.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from karios.bootapi import core
from karios.common.contracts.inventory import Host, HostInterface
from karios.common.oscatalog import CatalogEntry, TemplateSet, TemplateSetError, load_template_set
from karios.common.oscatalog.templates import TemplateRenderError

SAMPLE_BASE_URL = "http://bootapi.example.net:8081"
SAMPLE_MAC = "52:54:00:12:34:56"
SAMPLE_TOKEN = "sample-provision-token"  # noqa: S105 - a placeholder rendered into sample configs only
SHELLS = ("/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/sh", "sh", "bash")


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failures: int = 0

    def ok(self, what: str) -> None:
        self.lines.append(f"ok    {what}")

    def fail(self, what: str, why: str) -> None:
        self.failures += 1
        detail = "\n".join(f"      {line}" for line in why.strip().splitlines()[:40])
        self.lines.append(f"FAIL  {what}\n{detail}")


def sample_host(entry: CatalogEntry) -> Host:
    return Host(
        id=1,
        name=f"sample-{entry.name}.example.net",
        platform=entry.platforms[0],
        role=entry.roles[0] if entry.roles else "compute",
        site="lab",
        primary_ipv4="192.0.2.10/24",
        interfaces=[HostInterface(name="eno1", macs=[SAMPLE_MAC], ipv4=["192.0.2.10/24"])],
    )


def _tool(name: str) -> str | None:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _run(cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def check_kickstart(text: str, workdir: Path) -> list[str]:
    """Problems found by ksvalidator's checks and ``bash -n`` (empty list = valid).

    Runs pykickstart in-process exactly as the ``ksvalidator`` script does (latest syntax,
    parse and deprecation warnings are errors), which saves a Python start per file.
    """
    from pykickstart.errors import KickstartError, KickstartParseWarning
    from pykickstart.parser import KickstartParser
    from pykickstart.version import DEFAULT_VERSION, makeVersion

    parser = KickstartParser(makeVersion(DEFAULT_VERSION), errorsAreFatal=False)
    said = io.StringIO()  # pykickstart prints each error it tolerates
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            warnings.simplefilter("error", KickstartParseWarning)
            parser.readKickstartFromString(text)
    except KickstartParseWarning as exc:
        return [f"ksvalidator: deprecated or questionable syntax: {exc}"]
    except KickstartError as exc:
        return [f"ksvalidator: {exc}"]
    if parser.errorsCount:
        detail = " ".join(line.strip() for line in said.getvalue().splitlines() if line.strip())
        return [f"ksvalidator: {parser.errorsCount} error(s): {detail}"]
    problems: list[str] = []
    for i, script in enumerate(parser.handler.scripts):
        interp = script.interp or "/bin/sh"
        if interp not in SHELLS:
            continue
        f = workdir / f"script-{i}.sh"
        f.write_text(script.script)
        rc, out = _run(["bash", "-n", str(f)])
        if rc != 0:
            section = {0: "%pre", 1: "%post", 2: "%traceback", 3: "%pre-install", 4: "%onerror"}.get(
                script.type, "%?"
            )
            problems.append(f"bash -n on {section} (line {script.lineno}): {out}")
    return problems


def debconf_checkonly(preseed: Path, tool: str = "debconf-set-selections") -> tuple[int, str]:
    """``debconf-set-selections --checkonly`` on a private, empty debconf database: on the
    machine's own it takes the database's lock, and while anything else holds it (apt, dpkg,
    another check at the same moment) it exits 1 and prints nothing — a valid preseed refused
    with no reason. The check reads only the file; the database is never consulted."""
    with tempfile.TemporaryDirectory(prefix="karios-debconf-") as d:
        env = {**os.environ, "DEBCONF_DB_REPLACE": f"File{{{d}/config.dat}}"}
        return _run([tool, "--checkonly", str(preseed)], env=env)


def check_preseed(text: str, workdir: Path) -> list[str]:
    tool = _tool("debconf-set-selections")
    if tool is None:
        return ["debconf-set-selections not found (apt-get install debconf)"]
    f = workdir / "preseed.cfg"
    f.write_text(text)
    rc, out = debconf_checkonly(f, tool)
    if rc != 0 or "warning" in out.lower():
        return [f"debconf-set-selections --checkonly (exit {rc}): {out or 'no output'}"]
    return []


def check_ipxe(text: str) -> list[str]:
    return [] if text.startswith("#!ipxe\n") else ["an iPXE script must start with '#!ipxe'"]


def _check(report: Report, what: str, render: Callable[[], str], check: Callable[[str], list[str]]) -> None:
    try:
        text = render()
    except TemplateRenderError as exc:
        report.fail(what, f"render: {exc}")
        return
    problems = check(text)
    if problems:
        report.fail(what, "\n".join(problems))
    else:
        report.ok(what)


def validate_template_set(templates: TemplateSet, report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="bootapi-validate-") as tmp:
        work = Path(tmp)
        for fallback in ("local", "shell"):
            _check(
                report,
                f"ipxe/fallback-{fallback}.ipxe.j2",
                lambda f=fallback: core.render_fallback_script(templates, f, SAMPLE_MAC),
                check_ipxe,
            )
        if core.DISCOVERY_TEMPLATE in templates.sources:
            _check(
                report,
                core.DISCOVERY_TEMPLATE,
                lambda: core.render_discovery_script(
                    templates, core.DiscoveryBoot(SAMPLE_BASE_URL), SAMPLE_MAC, "k1.sample"
                ),
                check_ipxe,
            )
        for entry in templates.catalog.entries:
            host = sample_host(entry)
            _check(
                report,
                f"{entry.name}: ipxe/boot.ipxe.j2",
                lambda e=entry, h=host: core.render_ipxe_script(templates, h, SAMPLE_MAC, e, SAMPLE_BASE_URL),
                check_ipxe,
            )
            checker = check_kickstart if entry.installer == "kickstart" else check_preseed
            for token, label in ((SAMPLE_TOKEN, "with callback"), ("", "without callback")):
                _check(
                    report,
                    f"{entry.name}: {entry.template} ({core.config_kind(entry)}, {label})",
                    lambda e=entry, h=host, t=token: core.render_install_config(
                        templates, h, e, mac=SAMPLE_MAC, base_url=SAMPLE_BASE_URL, provision_token=t
                    ),
                    lambda text, c=checker: c(text, work),
                )


def validate_directory(directory: Path) -> Report:
    report = Report()
    try:
        templates = load_template_set(directory)
    except TemplateSetError as exc:
        report.fail(f"load {directory}", str(exc))
        return report
    report.ok(
        f"load {directory}: {len(templates.catalog.entries)} catalog entries, "
        f"{len(templates.sources)} templates"
    )
    validate_template_set(templates, report)
    return report


def run(directory: Path) -> int:
    """CLI entry: print one line per check; exit 1 on any failure."""
    report = validate_directory(directory)
    for line in report.lines:
        print(line)
    if report.failures:
        print(f"{report.failures} check(s) failed", file=sys.stderr)
        return 1
    print(f"all {len(report.lines)} checks passed")
    return 0
