"""Fabric apply to N lab nodes: Karios' rollout core beside `ansible-playbook`, same nodes, same run.

    uv run python benchmarks/fabric_apply.py [--nodes 3,12,25,50] [--ansible-pipelining]

Needs root (tests/lab/fabric_lab.py: nodes are network namespaces with a real sshd and a private
/etc/frr, plus an FRR route reflector in the fabric namespace); otherwise it prints why and exits 0.
For each N, one FabricLab with N nodes (node3 keeps a 1500 underlay MTU, as in the lab tests):

(a) Karios: ``ApplyJob`` (driven as tests/integration/fabric_rollout/test_rollout_lab.py does, no
    bus/DB) with fan-out N, timed from start until every node verified (EVPN session to the RR
    Established and EVPN routes sent); then the no-op re-apply; then teardown to empty nodes;
    then a cancel half-way through an apply to empty nodes (time from ``cancel()`` to the job's
    end, every touched node rolled back). The peak RSS of this process during the apply is the
    rollout core's memory as the worker runs it.
(b) Ansible: ``ansible-playbook`` (PyPI ansible-core in a cached venv at
    ``${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/ansible-venv``, never the project env) running
    benchmarks/fabric_apply_playbook.yml with the default (linear) strategy and forks = N over
    OpenSSH with the lab's key and known_hosts. It copies the FRR files Karios' own renderer
    produced for each node (identical bytes), creates vtep0 (dummy, else the veth fallback),
    vxlanN/brN with Karios' overlay MTU, starts FRR and polls ``show bgp l2vpn evpn summary json``
    until the RR peer is Established with routes sent (``until`` loop, same 0.3 s interval as
    Karios). Then its no-op re-run, a Karios apply on Ansible's result (must find every node
    unchanged: proof that both reach the same state), and teardown.

A thread polls the route reflector every 0.2 s during each apply: "Established at RR" is when it
first saw every node Established (independent of either tool's own report). The lab is always
torn down (context manager, also on Ctrl-C/SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from karios.fabric_worker.rollout import (
    ApplyJob,
    FabricIntent,
    NodeTarget,
    RolloutOptions,
    allocate_vteps,
    run_teardown_job,
)
from karios.fabric_worker.rollout.render import NodeRenderInput, render_node_files

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = Path(__file__).with_name("fabric_apply_playbook.yml")
sys.path.insert(0, str(ROOT / "tests" / "lab"))
import fabric_lab  # noqa: E402

ANSIBLE_CORE = "ansible-core==2.19.14"  # newest that runs on Debian 12's python3.11 controller
VERIFY_TIMEOUT = 60.0
VERIFY_INTERVAL = 0.3  # Karios' verify poll (as the lab tests) and Ansible's `until` delay
OPTS = RolloutOptions(connect_timeout=5, verify_timeout=VERIFY_TIMEOUT, verify_interval=VERIFY_INTERVAL)
ANSIBLE_TIMEOUT = 600.0
LAB_PREFIX = "kbench"
GOAL = 20.0  # issue 28: the apply at 50 nodes >= 20x faster than Ansible


def make_intent() -> FabricIntent:
    """The lab tests' intent: iBGP 65000 to the RR, BGP underlay, VNIs 100/200, VXLAN MTU 9000."""
    return FabricIntent(
        asn=65000,
        peer_ip=fabric_lab.FABRIC_IP,
        router_id_base="198.19.1.1",
        router_id_prefix_len=24,
        underlay_cidr="198.18.0.0/24",
        vxlan_mtu=9000,
        vnis=[100, 200],
        frr_log_file="/run/frr/frr.log",
    )


# -- machine load ------------------------------------------------------------------------------


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals[:8]), idle


@contextlib.contextmanager
def perf_record(n_nodes: int):
    """With ``KARIOS_BENCH_PERF=DIR``: ``perf record -a`` over the Karios apply (the whole
    machine: the worker, every node's sshd/FRR/vtysh, the RR) into DIR/apply-<N>.data, for
    ``perf report -i … --sort comm`` (where the apply's CPU goes). Unset: nothing."""
    out = os.environ.get("KARIOS_BENCH_PERF")
    if not out or not shutil.which("perf"):
        yield
        return
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, f"apply-{n_nodes}.data")
    proc = subprocess.Popen(
        ["perf", "record", "-a", "-F", "499", "-o", data, "--", "sleep", "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # perf's buffers mapped before the apply starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        print(f"  perf: {data} (perf report -i {data} --sort comm)", flush=True)


class LoadSampler:
    """CPU over a window: whole machine busy % (/proc/stat), and the share of it used by other
    processes: not this benchmark or its children, not inside this lab's namespaces, not one of its ssh
    masters, not a kernel thread. Per-process CPU is sampled every `interval` s (processes born and
    gone between two samples are missed, ours and others' alike)."""

    def __init__(self, lab, interval: float = 0.5) -> None:
        self.interval = interval
        self._lab_nets = set()
        for ns in [n.netns for n in lab.nodes] + [lab.fabric_netns]:
            with contextlib.suppress(OSError):
                self._lab_nets.add(f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]")
        self.busy = self.others = 0.0
        self._me = os.getpid()
        self._class: dict[int, str] = {}
        self._other_ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _procs() -> dict[int, tuple[int, int]]:
        out = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{d}/stat") as fh:
                        stat = fh.read()
                    rest = stat[stat.rindex(")") + 2 :].split()
                    out[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]))  # ppid, utime+stime
        return out

    def _kind(self, pid: int, procs: dict[int, tuple[int, int]]) -> str:
        if pid in self._class:
            return self._class[pid]
        kind = "other"
        p, hops = pid, 0
        while p > 1 and hops < 64:
            if p == self._me:
                kind = "ours"
                break
            if p == 2:
                kind = "kernel"
                break
            p, hops = procs.get(p, (0, 0))[0], hops + 1
        if kind == "other":
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/net") in self._lab_nets:
                    kind = "ours"  # this lab's nodes and RR (another lab's count as others)
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"karios-bench-ansible-" in fh.read():
                    kind = "ours"  # ssh ControlPersist masters (re-parented)
        self._class[pid] = kind
        return kind

    def _run(self) -> None:
        prev = self._procs()
        while not self._stop.wait(self.interval):
            cur = self._procs()
            for pid, (_, ticks) in cur.items():
                if pid in prev and self._kind(pid, cur) == "other":
                    self._other_ticks += max(0, ticks - prev[pid][1])
            prev = cur

    def __enter__(self) -> LoadSampler:
        self._t0 = _cpu_times()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        total, idle = _cpu_times()
        dt = total - self._t0[0]
        if dt > 0:
            self.busy = 100.0 * (1 - (idle - self._t0[1]) / dt)
            self.others = 100.0 * self._other_ticks / dt


def background_load(seconds: float = 2.0) -> float:
    """CPU busy % over `seconds` while this benchmark does nothing: what else loads the machine."""
    time.sleep(0.5)  # let what the lab setup / reset started settle
    t0 = _cpu_times()
    time.sleep(seconds)
    total, idle = _cpu_times()
    return 100.0 * (1 - (idle - t0[1]) / (total - t0[0])) if total > t0[0] else 0.0


def other_labs(lab) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted({re.sub(r"-node\d+$|-fabric$", "", n) for n in names if not n.startswith(lab.run_id)})


# -- lab helpers (as in tests/integration/fabric_rollout/test_rollout_lab.py) -------------------


def sh(lab, node, cmd: str) -> str:
    return lab.node_exec(node, cmd).stdout.strip()


def rr_all_established(lab, after: str, grace: float = 30.0) -> None:
    """Every node Established at the RR. On a loaded machine a session may flap (hold time 9 s)
    right after the apply: allow ``grace`` seconds for it to come back, and say so."""
    deadline = time.monotonic() + grace
    while True:
        states = lab.rr_evpn_peer_states()
        down = [n.underlay_ip for n in lab.nodes if states.get(n.underlay_ip) != "Established"]
        if not down:
            return
        if time.monotonic() > deadline:
            # Seen once at N = 50: a node Established with routes sent, its session Up in the RR's
            # log, yet absent from the RR's `summary json`. Reported with the node's own view
            # instead of discarding the run; a node that really is down fails its verify anyway.
            views = {
                ip: sh(lab, n, "vtysh -c 'show bgp l2vpn evpn summary' | grep -E '^198[.]18[.]0[.]1 '")
                for n in lab.nodes
                if (ip := n.underlay_ip) in down
            }
            print(
                f"  WARNING: RR does not list {down} Established {grace:.0f} s after {after}; "
                f"the nodes' own view: {views}",
                flush=True,
            )
            return
        print(f"  note: RR sees {down} not Established after {after}; waiting (session flap?)", flush=True)
        time.sleep(2)


def node_leftovers(lab, node) -> list[str]:
    """What differs from an empty node (for a report; ``node_empty`` is the yes/no)."""
    out = []
    files = sh(lab, node, "ls -A /etc/frr")
    if files:
        out.append(f"/etc/frr: {files.split()}")
    if lab.node_exec(node, "ip link show vtep0").returncode == 0:
        out.append("vtep0")
    vx = sh(lab, node, "ip -br link show type vxlan")
    if vx:
        out.append(f"vxlan: {vx.split()[0]}")
    if lab.node_exec(node, "kill -0 $(cat /run/frr/zebra.pid) 2>/dev/null").returncode == 0:
        out.append("zebra running")
    return out


def node_empty(lab, node) -> bool:
    return (
        sh(lab, node, "ls -A /etc/frr") == ""
        and lab.node_exec(node, "ip link show vtep0").returncode != 0
        and sh(lab, node, "ip -br link show type vxlan") == ""
        and lab.node_exec(node, "kill -0 $(cat /run/frr/zebra.pid) 2>/dev/null").returncode != 0
    )


def reset_nodes(lab) -> None:
    """Every node back to the lab's initial state (FRR stopped, /etc/frr empty, no vtep0/vxlan/br).
    Nodes are reset 8 at a time (an FRR stop takes ~2 s: one by one, 50 nodes took minutes)."""
    cmd = (
        "/usr/lib/frr/frrinit.sh stop >/dev/null 2>&1; rm -rf /etc/frr/* /etc/frr/.[!.]*; "
        "for l in $(ip -br link | awk '{print $1}' | cut -d@ -f1 "
        "| grep -E '^(vtep0|vtep0p|vxlan[0-9]+|br[0-9]+)$'); "
        "do ip link del $l 2>/dev/null; done; true"
    )
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: lab.node_exec(n, cmd), lab.nodes))
        empty = list(pool.map(lambda n: node_empty(lab, n), lab.nodes))
    bad = [n.name for n, ok in zip(lab.nodes, empty, strict=True) if not ok]
    if bad:
        raise RuntimeError(f"nodes not back to empty: {bad}")
    wait_rr_quiet(lab)


def wait_rr_quiet(lab, timeout: float = 20.0) -> None:
    """Until the RR holds no session to a node (dynamic neighbours go away with the node's FRR)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError):
            if not any(s == "Established" for s in lab.rr_evpn_peer_states().values()):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"RR still has sessions after {timeout:.0f} s: {lab.rr_evpn_peer_states()}")
        time.sleep(0.1)


def node_snapshot(lab) -> dict[str, str]:
    """What an apply leaves on each node (files' hash, vtep0, vxlan/bridge MTUs and local IPs)."""
    cmd = (
        "cd /etc/frr && sha256sum daemons frr.conf vtysh.conf | awk '{print $1}' | xargs; "
        "ip -4 -o addr show dev vtep0 | awk '{print $4}'; "
        "for v in vxlan100 vxlan200 br100 br200; do echo $v $(cat /sys/class/net/$v/mtu); done; "
        "ip -d -o link show type vxlan | grep -o 'vxlan id [0-9]* local [0-9.]*' | sort | xargs"
    )
    return {n.name: sh(lab, n, cmd) for n in lab.nodes}


class RrWatch:
    """Polls the RR in a thread; `at` = seconds from `t0` until every node was Established."""

    def __init__(self, lab, t0: float, interval: float = 0.2) -> None:
        self.lab, self.t0, self.interval = lab, t0, interval
        self.ips = {n.underlay_ip for n in lab.nodes}
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                states = self.lab.rr_evpn_peer_states()
                if all(states.get(ip) == "Established" for ip in self.ips):
                    self.at = time.monotonic() - self.t0
                    return
            self._stop.wait(self.interval)

    def __enter__(self) -> RrWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- Karios ------------------------------------------------------------------------------------


def targets_of(lab) -> list[NodeTarget]:
    key = Path(lab.client_key_path).read_text()
    return [
        NodeTarget(node_ip=n.underlay_ip, fqdn=n.name, private_key=key, known_host_key=n.host_public_key)
        for n in lab.nodes
    ]


PHASES = ("node_connecting", "node_committing", "node_verifying", "node_ready")


class PhaseClock:
    """When each node reached each step of its apply (the job's own progress events)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.at: dict[str, dict[str, float]] = {}

    async def __call__(self, ev) -> None:
        if ev.state in PHASES and ev.node_ip:
            self.at.setdefault(ev.node_ip, {}).setdefault(ev.state, time.monotonic() - self.t0)

    def spans(self) -> dict[str, tuple[float, float]]:
        """Per step (connect+load, commit, verify): (median, max) seconds over the nodes."""
        out = {}
        for name, a, b in (
            ("load", "node_connecting", "node_committing"),
            ("commit", "node_committing", "node_verifying"),
            ("verify", "node_verifying", "node_ready"),
        ):
            d = sorted(t[b] - t[a] for t in self.at.values() if a in t and b in t)
            if d:
                out[name] = (d[len(d) // 2], d[-1])
        return out


def karios_apply(
    intent: FabricIntent, targets: list[NodeTarget], vteps: dict[str, str], clock=None, results=None
):
    """One apply job; `results` (a list) gets each node's result (``verified_s``: when its verify
    passed, the condition Ansible's `until` loop waits for)."""
    job = ApplyJob(intent, targets, vteps, concurrency=len(targets), options=OPTS, sink=clock)
    summary = asyncio.run(job.run())
    if results is not None:
        results.extend(job.results)
    return summary


def karios_cancel(intent: FabricIntent, targets: list[NodeTarget], vteps: dict[str, str], after: float):
    """Start an apply on empty nodes, cancel it ``after`` seconds in (mid-commit: FRR starting);
    return (seconds from the cancel until every touched node stopped its step and began its
    rollback, seconds until the job ended with every node rolled back, the job's final status)."""

    async def go() -> tuple[float | None, float, str]:
        rolling: dict[str, float] = {}

        async def sink(ev) -> None:
            if ev.state == "node_rolling_back":
                rolling.setdefault(ev.node_ip, time.monotonic())

        job = ApplyJob(intent, targets, vteps, concurrency=len(targets), options=OPTS, sink=sink)
        task = asyncio.create_task(job.run())
        await asyncio.sleep(after)
        t0 = time.monotonic()
        job.cancel()
        summary = await task
        stopped = max(rolling.values()) - t0 if rolling else None
        return stopped, time.monotonic() - t0, str(summary.job_status)

    return asyncio.run(go())


class RssPeak:
    """Peak resident memory of this process (the rollout core, as the worker runs it) while open."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.base, self.peak = interval, _rss_mib(), 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_mib())

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mib())


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- Ansible -----------------------------------------------------------------------------------


def cache_dir() -> str:
    return os.environ.get("KARIOS_LAB_CACHE") or "/var/cache/karios-lab"


def ansible_venv() -> str:
    """The cached ansible-core venv (built once with `python3 -m venv` + pip, outside the project)."""
    venv = os.path.join(cache_dir(), "ansible-venv")
    exe = os.path.join(venv, "bin", "ansible-playbook")
    marker = os.path.join(venv, ".karios-complete")

    def ready() -> bool:
        with contextlib.suppress(OSError):
            return Path(marker).read_text().strip() == ANSIBLE_CORE and os.access(exe, os.X_OK)
        return False

    if ready():
        return venv
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), "ansible-venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready():
            return venv
        print(f"building {venv} ({ANSIBLE_CORE}) ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        # The system interpreter, not the project venv's (uv run puts that first on PATH).
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys._base_executable
        try:
            subprocess.run([python, "-m", "venv", venv], check=True, capture_output=True)
            res = subprocess.run(
                [
                    os.path.join(venv, "bin", "pip"),
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    ANSIBLE_CORE,
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if res.returncode != 0:
                raise RuntimeError(f"pip install {ANSIBLE_CORE} failed:\n{res.stdout}\n{res.stderr}")
            Path(marker).write_text(ANSIBLE_CORE + "\n")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
    return venv


@dataclass
class AnsibleRun:
    seconds: float
    rc: int
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    log: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.rc == 0
            and bool(self.recap)
            and all(r.get("failed", 1) == 0 and r.get("unreachable", 1) == 0 for r in self.recap.values())
        )

    @property
    def changed(self) -> int:
        return sum(r.get("changed", 0) for r in self.recap.values())


class AnsibleProject:
    """A temp dir with ansible.cfg, inventory, extra vars, the playbook and Karios-rendered files."""

    def __init__(self, venv: str, lab, intent: FabricIntent, vteps: dict[str, str], *, pipelining: bool):
        self.venv, self.lab = venv, lab
        self.dir = tempfile.mkdtemp(prefix="karios-bench-ansible-")
        self.cp_dir = os.path.join(self.dir, "cp")
        os.makedirs(self.cp_dir)
        os.makedirs(os.path.join(self.dir, "local-tmp"))
        files_dir = os.path.join(self.dir, "files")
        inventory = ["[nodes]"]
        for n in lab.nodes:
            vtep = vteps[n.underlay_ip]
            inventory.append(f"{n.name} ansible_host={n.ssh_host} ansible_port={n.ssh_port} vtep_ip={vtep}")
            # The same renderer Karios' apply uses, with what its discovery finds on a lab node.
            rendered = render_node_files(
                intent, NodeRenderInput(hostname=n.name, vtep_ip=vtep, underlay_iface="br-underlay")
            )
            ndir = os.path.join(files_dir, n.name)
            os.makedirs(ndir)
            for name, content in rendered.as_dict().items():
                Path(ndir, name).write_text(content)
        ssh_common = (
            f"-F /dev/null -o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes "
            "-o IdentitiesOnly=yes"
        )
        inventory += [
            "",
            "[nodes:vars]",
            "ansible_user=root",
            f"ansible_ssh_private_key_file={lab.client_key_path}",
            f"ansible_ssh_common_args='{ssh_common}'",
            "ansible_python_interpreter=/usr/bin/python3",
        ]
        Path(self.dir, "inventory.ini").write_text("\n".join(inventory) + "\n")
        extra = {
            "files_dir": files_dir,
            "peer_ip": intent.peer_ip,
            "underlay_cidr": intent.underlay_cidr,
            "vxlan_mtu": intent.vxlan_mtu,
            "vnis": list(intent.vnis),
            "verify_delay": VERIFY_INTERVAL,
            "verify_retries": math.ceil(VERIFY_TIMEOUT / VERIFY_INTERVAL),
        }
        Path(self.dir, "vars.json").write_text(json.dumps(extra, indent=1))
        shutil.copy(PLAYBOOK, os.path.join(self.dir, "playbook.yml"))
        # Defaults everywhere (linear strategy, ssh ControlPersist 60 s, sftp transfers, no
        # pipelining unless asked) except forks = N and the explicit remote interpreter.
        Path(self.dir, "ansible.cfg").write_text(
            "[defaults]\n"
            f"inventory = {self.dir}/inventory.ini\n"
            f"forks = {len(lab.nodes)}\n"
            "strategy = linear\n"
            "host_key_checking = True\n"
            "retry_files_enabled = False\n"
            "timeout = 10\n"
            f"local_tmp = {self.dir}/local-tmp\n"
            "[ssh_connection]\n"
            f"control_path_dir = {self.cp_dir}\n"
            f"pipelining = {pipelining}\n"
        )

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_RUN_RECURSION_DEPTH")
        }
        env["PATH"] = os.path.join(self.venv, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env["ANSIBLE_CONFIG"] = os.path.join(self.dir, "ansible.cfg")
        env["ANSIBLE_NOCOLOR"] = "1"
        env["ANSIBLE_HOME"] = os.path.join(self.dir, "ansible-home")
        return env

    def run(self, label: str) -> AnsibleRun:
        log_path = os.path.join(self.dir, f"{label}.log")
        argv = [
            os.path.join(self.venv, "bin", "ansible-playbook"),
            os.path.join(self.dir, "playbook.yml"),
            "-e",
            "@" + os.path.join(self.dir, "vars.json"),
        ]
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=ANSIBLE_TIMEOUT)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        seconds = time.monotonic() - t0
        text = Path(log_path).read_text()
        recap = {}
        for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", text, re.M):
            recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        return AnsibleRun(seconds=seconds, rc=rc, recap=recap, log=text)

    def close(self) -> None:
        """Stop the ssh ControlPersist masters (they live in the root namespace) and remove the dir."""
        for sock in Path(self.cp_dir).iterdir() if os.path.isdir(self.cp_dir) else ():
            subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "ignored"],
                capture_output=True,
                timeout=10,
            )
        if os.environ.get("KARIOS_BENCH_KEEP"):
            print(f"  kept {self.dir} (KARIOS_BENCH_KEEP)", flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- one N -------------------------------------------------------------------------------------


@dataclass
class Row:
    n: int
    karios_s: float = 0.0
    karios_est_s: float | None = None
    karios_verified_s: float | None = None  # every node verified (Ansible's condition), job running on
    karios_noop_s: float = 0.0
    karios_cpu: float = 0.0
    karios_others: float = 0.0
    ansible_s: float = 0.0
    ansible_est_s: float | None = None
    ansible_noop_s: float | None = None
    ansible_noop_changed: int = -1
    ansible_cpu: float = 0.0
    ansible_others: float = 0.0
    equivalent: bool = False
    background_cpu: float = 0.0
    loadavg: float = 0.0
    others: list[str] = field(default_factory=list)
    lab_start_s: float = 0.0
    cancel_stop_s: float | None = None  # cancel requested → every touched node stopped, rolling back
    cancel_s: float | None = None  # cancel requested → job ended (every touched node rolled back)
    cancel_status: str = ""
    rss_base_mib: float = 0.0  # this process (the worker's rollout core) before the apply
    rss_peak_mib: float = 0.0  # and its peak during the apply
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # step → (median, max) s


def _route_dev(ip: str) -> str:
    out = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True).stdout
    m = re.search(r"\bdev (\S+)", out)
    return m.group(1) if m else ""


def wait_host_route(lab, timeout: float = 240.0) -> None:
    """Until the root namespace reaches the nodes through this lab's host link.

    A lab's namespace can outlive `ip netns del` for a minute or two while the kernel still holds
    orphaned TCP sockets of processes killed mid-session; its host veth (and 198.18.0.0/24 route)
    stays in the root namespace meanwhile and wins over the new lab's route.
    """
    deadline, said = time.monotonic() + timeout, False
    while (dev := _route_dev(lab.nodes[0].underlay_ip)) != lab.host_ifname:
        if time.monotonic() > deadline:
            raise RuntimeError(f"198.18.0.0/24 still routed via {dev!r}, not {lab.host_ifname}")
        if not said:
            print(f"  waiting for a stale host link ({dev}) of a finished lab to go away ...", flush=True)
            said = True
        time.sleep(1)


def wait_host_link_gone(lab, timeout: float = 180.0) -> None:
    """Leave the machine clean for the next lab (CI): our root-namespace veth must be gone."""
    deadline, said = time.monotonic() + timeout, False
    while os.path.exists(f"/sys/class/net/{lab.host_ifname}") and time.monotonic() < deadline:
        if not said and time.monotonic() > deadline - timeout + 2:
            print(f"  waiting for the kernel to release {lab.host_ifname} ...", flush=True)
            said = True
        time.sleep(0.5)


def host_lock_busy() -> bool:
    path = os.path.join(fabric_lab.LOCK_DIR, "host-link.lock")
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def bench_one(
    n_nodes: int, intent: FabricIntent, venv: str, *, pipelining: bool, rerun: bool, with_ansible: bool
) -> Row:
    row = Row(n=n_nodes)
    if host_lock_busy():
        print(
            "  another lab holds the host-link lock (CI run?): waiting for it (up to 15 min) ...", flush=True
        )
    t0 = time.monotonic()
    lab = fabric_lab.FabricLab(
        n_nodes=n_nodes, prefix=LAB_PREFIX, mtu_overrides={"node3": 1500}, host_link_lock_timeout=900
    )
    with lab:
        row.lab_start_s = time.monotonic() - t0
        try:
            wait_host_route(lab)
            measure(lab, row, intent, venv, pipelining=pipelining, rerun=rerun, with_ansible=with_ansible)
        finally:
            # Sessions closed gracefully before the namespaces go (see wait_host_link_gone).
            with contextlib.suppress(Exception):
                reset_nodes(lab)
    wait_host_link_gone(lab)
    return row


def _phases(row: Row) -> str:
    return ", ".join(f"{k} {m:.2f} / {x:.2f}" for k, (m, x) in row.phases.items()) or "–"


def measure(
    lab, row: Row, intent: FabricIntent, venv: str, *, pipelining: bool, rerun: bool, with_ansible: bool
) -> None:
    n_nodes = len(lab.nodes)
    reset_nodes(lab)
    row.others = other_labs(lab)
    row.loadavg = os.getloadavg()[0]
    row.background_cpu = background_load()
    targets = targets_of(lab)
    vteps = allocate_vteps(intent, [t.node_ip for t in targets])

    # (a) Karios
    clock = PhaseClock()
    with perf_record(n_nodes):
        t0 = time.monotonic()
        with LoadSampler(lab) as load, RrWatch(lab, t0) as watch, RssPeak() as rss:
            results: list = []
            summary = karios_apply(intent, targets, vteps, clock, results)
            row.karios_s = time.monotonic() - t0
    row.phases = clock.spans()
    row.rss_base_mib, row.rss_peak_mib = rss.base, rss.peak
    row.karios_cpu, row.karios_others = load.busy, load.others
    if summary.job_status != "completed":
        raise RuntimeError(f"Karios apply did not complete: {summary.model_dump_json(indent=1)}")
    row.karios_est_s = watch.at
    verified = [r.verified_s for r in results if r.verified_s is not None]
    row.karios_verified_s = max(verified) if len(verified) == len(results) else None
    rr_all_established(lab, "the Karios apply")
    reference = node_snapshot(lab)
    t0 = time.monotonic()
    again = karios_apply(intent, targets, vteps)
    row.karios_noop_s = time.monotonic() - t0
    if again.job_status != "completed" or any(n.changed for n in again.nodes):
        raise RuntimeError(f"Karios re-apply was not a no-op: {again.model_dump_json(indent=1)}")
    teardown = asyncio.run(run_teardown_job(intent, targets, concurrency=n_nodes, options=OPTS))
    if teardown.job_status != "completed":
        raise RuntimeError(f"Karios teardown failed: {teardown.model_dump_json(indent=1)}")
    reset_nodes(lab)
    # Cancel mid-apply: half-way to where the apply had every node verified (FRR starting).
    row.cancel_stop_s, row.cancel_s, row.cancel_status = karios_cancel(
        intent, targets, vteps, after=row.karios_s / 2
    )
    left = {n.name: node_leftovers(lab, n) for n in lab.nodes}
    left = {k: v for k, v in left.items() if v}
    if left:
        print(f"  WARNING: nodes not back at their (empty) baseline after the cancel: {left}", flush=True)
    reset_nodes(lab)
    print(
        f"  karios: apply {row.karios_s:.2f} s (RR Established {fmt(row.karios_est_s)} s), "
        f"no-op {row.karios_noop_s:.2f} s, cancel: nodes stopped {fmt(row.cancel_stop_s)} s, "
        f"{row.cancel_status} (rolled back) {fmt(row.cancel_s)} s, "
        f"RSS {row.rss_base_mib:.0f} → peak {row.rss_peak_mib:.0f} MiB, CPU busy {row.karios_cpu:.0f}%",
        flush=True,
    )
    print("  karios per node (median / max s): " + _phases(row), flush=True)
    if not with_ansible:
        return

    # (b) Ansible
    project = AnsibleProject(venv, lab, intent, vteps, pipelining=pipelining)
    try:
        t0 = time.monotonic()
        with LoadSampler(lab) as load, RrWatch(lab, t0) as watch:
            first = project.run("apply")
        row.ansible_cpu, row.ansible_others = load.busy, load.others
        if not first.ok:
            raise RuntimeError(f"ansible-playbook failed (rc {first.rc}):\n{first.log[-6000:]}")
        row.ansible_s, row.ansible_est_s = first.seconds, watch.at
        rr_all_established(lab, "Ansible")
        if rerun:
            noop = project.run("reapply")
            if not noop.ok:
                raise RuntimeError(f"ansible-playbook re-run failed (rc {noop.rc}):\n{noop.log[-6000:]}")
            row.ansible_noop_s, row.ansible_noop_changed = noop.seconds, noop.changed
        got = node_snapshot(lab)
        check = karios_apply(intent, targets, vteps)  # Karios must find nothing to change
        row.equivalent = (
            got == reference and check.job_status == "completed" and not any(n.changed for n in check.nodes)
        )
        if not row.equivalent:
            diff = {k: (reference.get(k), got.get(k)) for k in reference if reference.get(k) != got.get(k)}
            print(f"  WARNING: Ansible's end state differs from Karios': {diff}", flush=True)
    finally:
        project.close()
    reset_nodes(lab)
    noop = f", no-op {fmt(row.ansible_noop_s)} s (changed={row.ansible_noop_changed})" if rerun else ""
    print(
        f"  ansible: apply {row.ansible_s:.2f} s (RR Established {fmt(row.ansible_est_s)} s){noop}",
        flush=True,
    )


# -- report ------------------------------------------------------------------------------------


def fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def report(rows: list[Row], *, pipelining: bool, ansible_startup: float) -> None:
    print()
    base = next((r.karios_s for r in rows if r.n == 3), rows[0].karios_s)
    print(
        "| N nodes | Karios apply (s) | vs 3-node apply | Karios no-op (s) | cancel → nodes stopped / "
        "rolled back (s) | "
        "worker RSS before / peak (MiB) | Ansible (s) | Ansible / Karios | of the 20x goal |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        ratio = r.ansible_s / r.karios_s if r.ansible_s else 0.0
        print(
            f"| {r.n} | {r.karios_s:.2f} | {r.karios_s / base:.2f}x | {r.karios_noop_s:.2f} | "
            f"{fmt(r.cancel_stop_s)} / {fmt(r.cancel_s)} ({r.cancel_status}) | "
            f"{r.rss_base_mib:.0f} / {r.rss_peak_mib:.0f} | "
            + (f"{r.ansible_s:.2f} | {ratio:.1f}x | {ratio / GOAL:.2f} |" if r.ansible_s else "– | – | – |")
        )
    print()
    print(
        "Same condition on both sides — every node Established with EVPN routes sent (what Ansible's "
        "`until` loop waits for; Karios's job then goes on with its post-deploy checks: VNIs, IMET "
        "routes from every VTEP, a DF ping across VXLAN):"
    )
    print(
        "\n| N nodes | Karios: every node verified (s) | Ansible (s) | Ansible / Karios | of the 20x goal |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        v = r.karios_verified_s
        ratio = r.ansible_s / v if r.ansible_s and v else 0.0
        print(
            f"| {r.n} | {fmt(v)} | "
            + (f"{r.ansible_s:.2f} | {ratio:.1f}x | {ratio / GOAL:.2f} |" if ratio else "– | – | – |")
        )
    print()
    print("| N nodes | Karios per node, median / max (s): connect + load | commit | verify |")
    print("| ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [
            f"{r.phases[k][0]:.2f} / {r.phases[k][1]:.2f}" if k in r.phases else "–"
            for k in ("load", "commit", "verify")
        ]
        print(f"| {r.n} | " + " | ".join(cells) + " |")
    print()
    rerun = any(r.ansible_noop_s is not None for r in rows)
    print(
        "| N nodes | Karios no-op re-apply (s) | "
        + ("Ansible no-op re-run (s) | " if rerun else "")
        + "all Established at RR: Karios / Ansible (s) | Ansible end state = Karios' | "
        "CPU busy during apply: Karios / Ansible (other processes' share) | idle CPU before, loadavg 1m |"
    )
    print("| ---: | ---: | " + ("---: | " if rerun else "") + "---: | :---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r.n} | {r.karios_noop_s:.2f} | "
            + (f"{fmt(r.ansible_noop_s)} | " if rerun else "")
            + f"{fmt(r.karios_est_s)} / {fmt(r.ansible_est_s)} | {'yes' if r.equivalent else 'NO'} | "
            f"{r.karios_cpu:.0f}% ({r.karios_others:.0f}%) / "
            f"{r.ansible_cpu:.0f}% ({r.ansible_others:.0f}%) | "
            f"{r.background_cpu:.0f}% busy, {r.loadavg:.2f} |"
        )
    three = next((r for r in rows if r.n == 3), None)
    if three is not None:
        print(
            f"\n3-node Karios apply: every node Established at the RR after {fmt(three.karios_est_s)} s, "
            f"verified (Established + EVPN routes sent) after {fmt(three.karios_verified_s)} s; the job "
            f"done (with its post-deploy checks) after {three.karios_s:.2f} s."
        )
    others = sorted({o for r in rows for o in r.others})
    print(
        f"\nKarios: ApplyJob fan-out N, asyncssh, verify poll {VERIFY_INTERVAL} s. "
        f"Ansible: {ANSIBLE_CORE}, strategy linear (default), forks = N, gather_facts off, "
        f"pipelining {'on' if pipelining else 'off (default)'}, ControlPersist 60 s (default); "
        f"`ansible-playbook` start-up ≈ {ansible_startup:.2f} s is included in its times."
    )
    print(f"Machine: {os.cpu_count()} CPUs; other labs during the run: {', '.join(others) or 'none'}.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="3,12,25,50", help="comma-separated node counts (1..240)")
    ap.add_argument("--ansible-pipelining", action="store_true", help="ansible ssh pipelining on")
    ap.add_argument(
        "--ansible-rerun", action="store_true", help="also time Ansible's no-op re-run (adds ~7 s per node)"
    )
    ap.add_argument(
        "--no-ansible", action="store_true", help="Karios only (no ansible-playbook runs): for iterating"
    )
    args = ap.parse_args()
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    if not sizes or any(not 1 <= n <= fabric_lab.MAX_NODES for n in sizes):
        ap.error(f"--nodes: counts within 1..{fabric_lab.MAX_NODES}")
    reason = fabric_lab.skip_reason()
    if reason:
        print(f"SKIPPED: {reason}. Run as root: sudo -E uv run python benchmarks/fabric_apply.py")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the labs' __exit__ cleans up
    fabric_lab.ensure_packages()
    with_ansible = not args.no_ansible
    venv = ansible_venv() if with_ansible else ""
    intent = make_intent()
    rows: list[Row] = []
    ansible_startup = 0.0
    for n in sizes:
        print(f"N = {n}: lab up ...", flush=True)
        rows.append(
            bench_one(
                n,
                intent,
                venv,
                pipelining=args.ansible_pipelining,
                rerun=args.ansible_rerun,
                with_ansible=with_ansible,
            )
        )
        print(f"  (lab start {rows[-1].lab_start_s:.1f} s)", flush=True)
    with contextlib.suppress(Exception):
        if not with_ansible:
            raise RuntimeError("no ansible")
        t0 = time.monotonic()
        subprocess.run([os.path.join(venv, "bin", "ansible-playbook"), "--version"], capture_output=True)
        ansible_startup = time.monotonic() - t0
    report(rows, pipelining=args.ansible_pipelining, ansible_startup=ansible_startup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
