"""Where a test run's CPU goes: sample every process each ``--interval`` seconds until the pid
``--until`` exits (or Ctrl-C), then print CPU seconds by kind of process and how busy the machine
was. For the CI budget (docs/DEVELOPING.md): the suite is CPU-bound on 2 cores, so its wall time
is bounded below by its CPU seconds / cores — this says which processes to make cheaper.

    python scripts/ci_cpu.py --until <pid of scripts/test.sh> > /tmp/ci-cpu.txt &

Counts every process on the machine (PostgreSQL's and NATS's servers too, which ``time`` of the
test command does not): all the CPU of a process started after the sampler, the rest from when it
is first seen. A process that starts and ends between two samples is missed (its parent's
reaped-children time is not added: that would count twice what the samples saw) — the difference
between "all sampled" and the machine's busy time is theirs (and the kernel's).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import psutil

KINDS = [  # (kind, substrings of the command line), first match wins
    ("qemu (VM tests, TCG)", ("qemu-system",)),
    ("NetBox (lab)", ("netbox",)),
    ("Redfish emulators (lab)", ("sushy", "launch_sushy")),
    (
        "FRR / sshd in namespaces (lab)",
        ("bgpd", "zebra", "ospfd", "bfdd", "staticd", "mgmtd", "watchfrr", "sshd"),
    ),
    ("Chromium (console tests)", ("chrom",)),
    ("Karios services (karios run/up)", ("karios.cli run", "karios.cli up", "-m karios", "karios up")),
    ("pytest workers", ("exec(eval(sys.stdin.readline()))", "pytest")),
    ("PostgreSQL", ("postgres",)),
    ("NATS", ("nats-server",)),
    ("image builds / apt (lab)", ("mmdebstrap", "apt", "dpkg", "zstd", "xorriso", "mksquashfs", "cpio")),
    ("uv / compile", ("uv ", "/uv", "compileall")),
]


def kind_of(cmd: str) -> str:
    for kind, keys in KINDS:
        if any(k in cmd for k in keys):
            return kind
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--until", type=int, default=0, help="stop when this pid exits")
    ap.add_argument("--interval", type=float, default=2.0)
    a = ap.parse_args()
    seen: dict[int, tuple[str, str, float, float]] = {}  # pid -> (kind, name, first cpu, last cpu)
    t0, busy0, started = time.monotonic(), psutil.cpu_times(), time.time()
    try:
        while not a.until or psutil.pid_exists(a.until):
            for p in psutil.process_iter(["cmdline", "name"]):
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    cpu = t.user + t.system
                    # Kind and name as last seen: a process forked by a pytest worker or a shell
                    # and then exec'ing qemu counts as qemu (first seen, it was python or bash).
                    cmd = " ".join(p.info["cmdline"] or [p.info["name"] or ""])
                    kind, name = kind_of(cmd), (p.info["name"] or "?")[:30]
                    if p.pid in seen:
                        seen[p.pid] = (kind, name, seen[p.pid][2], cpu)
                    else:
                        # Started after us: all its CPU is the run's (a service's imports, say).
                        base = 0.0 if p.create_time() >= started else cpu
                        seen[p.pid] = (kind, name, base, cpu)
            time.sleep(a.interval)
    except KeyboardInterrupt:
        pass
    wall = time.monotonic() - t0
    end = psutil.cpu_times()
    idle = (end.idle + getattr(end, "iowait", 0)) - (busy0.idle + getattr(busy0, "iowait", 0))
    total = sum(end) - sum(busy0)
    by: dict[str, float] = {}
    names: dict[str, dict[str, float]] = {}  # kind -> process name -> CPU s
    for k, name, first, last in seen.values():
        by[k] = by.get(k, 0.0) + (last - first)
        names.setdefault(k, {})
        names[k][name] = names[k].get(name, 0.0) + (last - first)
    ncpu = psutil.cpu_count() or 1
    print(
        f"\nCPU of the run: {wall:.0f} s of wall time on {ncpu} CPUs, "
        f"machine {100 * (1 - idle / total):.0f} % busy"
    )
    print(f"(CPU seconds / {ncpu}: the wall time the run could not go below)\n")
    print("| processes | CPU s | share | CPU s / cores |")
    print("| --- | ---: | ---: | ---: |")
    counted = sum(by.values())
    for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {v:.0f} | {100 * v / counted:.0f} % | {v / ncpu:.0f} |")
    print(f"| all sampled | {counted:.0f} | 100 % | {counted / ncpu:.0f} |")
    busy = total - idle
    print(f"| machine busy (sampled + short-lived processes + kernel) | {busy:.0f} | | {busy / ncpu:.0f} |")
    print("\nby process name, in each kind (the top five, > 1 CPU s):")
    for k in sorted(by, key=lambda kind: -by[kind]):
        top = sorted(((c, n) for n, c in names[k].items() if c > 1), reverse=True)[:5]
        if top:
            print(f"- {k}: " + ", ".join(f"{n} {c:.0f} s" for c, n in top))


if __name__ == "__main__":
    main()
