"""What the fabric lab needs on this machine: its Debian packages (installed on demand, no daemon
started by them), root and network namespaces (:func:`skip_reason`). Stdlib only."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

from karios.cli.demo.host import acquire_lock, pid_alive, read_pid

PACKAGES = ("openssh-server", "frr", "frr-pythontools", "iproute2")


def missing_packages(packages=PACKAGES) -> list[str]:
    """Debian packages from `packages` that `dpkg -s` does not report as installed."""
    missing = []
    for pkg in packages:
        out = subprocess.run(["dpkg", "-s", pkg], capture_output=True, text=True)
        if out.returncode != 0 or "Status: install ok installed" not in out.stdout:
            missing.append(pkg)
    return missing


def ensure_packages(packages=PACKAGES, timeout: float = 900.0) -> list[str]:
    """Install missing lab packages with apt-get; return what was installed.

    Warm run (all installed) costs only the `dpkg -s` calls. Package scripts are kept
    from starting daemons (a system-wide sshd or FRR in the root namespace) by a
    temporary policy-rc.d, and any FRR the install still managed to start is stopped.
    """
    if not missing_packages(packages):
        return []
    lock_fd = acquire_lock("apt.lock", timeout)  # parallel pytest workers
    try:
        missing = missing_packages(packages)
        if not missing:
            return []
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_MODE="l")
        policy = "/usr/sbin/policy-rc.d"
        own_policy = not os.path.exists(policy)
        if own_policy:
            with open(policy, "w") as fh:
                fh.write("#!/bin/sh\n# karios lab: no daemon starts during install\nexit 101\n")
            os.chmod(policy, 0o755)  # noqa: S103 (an executable dpkg runs)
        try:
            cmd = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=600", "install", *missing]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                # Stale or empty package lists on a fresh machine.
                subprocess.run(
                    ["apt-get", "-q", "update"], env=env, capture_output=True, text=True, timeout=timeout
                )
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(
                    f"apt-get install {missing} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                )
        finally:
            if own_policy:
                os.unlink(policy)
        if "frr" in missing:
            _stop_system_frr()
        still = missing_packages(packages)
        if still:
            raise RuntimeError(f"packages still missing after apt-get: {still}")
        return missing
    finally:
        os.close(lock_fd)


def _stop_system_frr() -> None:
    """Stop an FRR that a package script started in the root namespace, if any."""
    alive = False
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/run/frr"):
            if name.endswith(".pid"):
                pid = read_pid(os.path.join("/run/frr", name))
                alive |= pid > 0 and pid_alive(pid)
    if alive:
        subprocess.run(["/usr/lib/frr/frrinit.sh", "stop"], capture_output=True, timeout=60)


def skip_reason() -> str | None:
    """Why the fabric lab cannot run here (for pytest.skip), or None when it can."""
    if os.geteuid() != 0:
        return "fabric lab needs root (network namespaces, bind mounts)"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if not shutil.which(tool):
            return f"fabric lab needs `{tool}` on PATH"
    probe = f"karios-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create network namespaces: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None
