"""Host-side helpers of the fabric lab: commands that must succeed, lock files, SSH keys, PID files
and FRR's per-instance directories. Stdlib only (see :mod:`karios.cli.demo`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time

LOCK_DIR = "/run/karios-lab"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def neighbour_table_need(n_nodes: int) -> int:
    """Neighbour entries a lab of `n_nodes` may hold at once, per family: the namespaces share
    the kernel's one ARP and one ND table, and every node resolves every other node's underlay
    address (the VXLAN next hop) and, on each of its bridges, the peers' link-locals."""
    return 4 * n_nodes * (n_nodes + 2)


def raise_neighbour_tables(n_nodes: int) -> list[str]:
    """Raise the kernel's neighbour-table limits (``gc_thresh2``/``gc_thresh3``, IPv4 and IPv6)
    to what `n_nodes` nodes need; never lowers them. Returns the settings changed ("name old →
    new"). The defaults (512 / 1,024 entries for the whole machine) are a real compute node's
    budget, but the lab's nodes share one kernel: at 50 nodes the ARP table overflowed
    ("neighbour: arp_cache: neighbor table overflow!") and VXLAN packets to peers whose underlay
    address was not resolved yet were dropped — the overlay pings of 15 of 50 nodes failed."""
    need = neighbour_table_need(n_nodes)
    changed = []
    for family in ("ipv4", "ipv6"):
        for name, want in (("gc_thresh2", need), ("gc_thresh3", 2 * need)):
            path = f"/proc/sys/net/{family}/neigh/default/{name}"
            try:
                with open(path) as fh:
                    old = int(fh.read().strip())
                if old < want:
                    with open(path, "w") as fh:
                        fh.write(str(want))
                    changed.append(f"net.{family}.neigh.default.{name} {old} → {want}")
            except (OSError, ValueError):
                continue  # not root, or no such setting: the lab works up to the default's size
    return changed


def run_checked(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def acquire_lock(name: str, timeout: float) -> int:
    os.makedirs(LOCK_DIR, exist_ok=True)
    fd = os.open(os.path.join(LOCK_DIR, name), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise TimeoutError(f"another lab holds {name} for more than {timeout:.0f} s") from None
            time.sleep(0.2)


def keygen(path: str, comment: str) -> None:
    run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def read_pid(path: str) -> int:
    try:
        with open(path) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def chown_frr(path: str) -> None:
    shutil.chown(path, "frr", "frr")


def make_frr_dirs(etc: str, run: str, *, seed: bool) -> None:
    """Per-instance /etc/frr (empty, or the package defaults) and /run/frr, owned by frr."""
    if seed:
        shutil.copytree(_package_frr_etc(), etc)
    else:
        os.makedirs(etc)
    os.makedirs(run)
    for d in (etc, run):
        chown_frr(d)
        for name in os.listdir(d):
            chown_frr(os.path.join(d, name))
    os.chmod(etc, 0o750)  # noqa: S103 (FRR's own group)
    os.chmod(run, 0o755)  # noqa: S103 (vtysh of any user, as the package sets /run/frr)


def _package_frr_etc() -> str:
    """The root namespace's /etc/frr (the package defaults unless someone edited them)."""
    if not os.path.exists("/etc/frr/daemons"):
        raise RuntimeError("/etc/frr/daemons missing: is frr installed? (ensure_packages())")
    return "/etc/frr"
