"""Interruptible steps (pure): every changing command a rollout runs on a node is wrapped so a
cancel stops it within seconds and a rollback is never raced by a late one; the FRR install.
Shell text only — :mod:`.node` runs it.
"""

from __future__ import annotations

import shlex

from karios.fabric_worker.rollout.facts import FRRINIT

# A cancel must bite within seconds whatever the node is doing (an FRR restart takes ~6 s). Every
# changing command records its process group in a per-node file — in /run/frr (one per FRR
# instance, so namespaces sharing /run never collide), or /run before FRR is installed — and
# the rollback of an aborted node first kills that group, stops FRR (an interrupted restart
# leaves daemons half up), then restores the baseline like after any other step.
STEP_DIR = "/run/frr"
STEP_PIDFILE = f"{STEP_DIR}/.karios-step.pid"
STEP_PIDFILE_NO_FRR = "/run/.karios-step.pid"


# A step the SSH client sent just before a cancel may start on the node only after the rollback
# looked for it (sshd forks late on a loaded host): it would then change the node behind the
# rollback. Each apply therefore tags its steps with a fence token; the rollback writes the token to
# a fence file *before* it reads the pid file, and a step writes its pid file *before* it reads the
# fence — so either the rollback sees the step (and kills it) or the step sees the fence (and exits
# without running).
STEP_FENCES = (f"{STEP_PIDFILE}.fence", f"{STEP_PIDFILE_NO_FRR}.fence")
FENCED_EXIT = 125


def step_command(command: str, *, killable: bool = True, fence: str = "") -> str:
    """`command` as an interruptible step (stdin passes through; exit status kept). A step
    that is not `killable` (the package install: dpkg is never killed half-way) is waited for.
    With a `fence` token, the step does not run once a rollback has fenced that token."""
    pick = f"f={shlex.quote(STEP_PIDFILE)}; [ -d {STEP_DIR} ] || f={shlex.quote(STEP_PIDFILE_NO_FRR)}; "
    how = "kill" if killable else "wait"
    check = ""
    if fence:
        files = " ".join(shlex.quote(p) for p in STEP_FENCES)
        check = (
            f"if cat {files} 2>/dev/null | grep -qxF -- {shlex.quote(fence)}; then "
            f"echo 'karios: step fenced by a rollback' >&2; exit {FENCED_EXIT}; fi; "
        )
    return (
        pick
        + f'echo "$$ {how}" > "$f" && {check}{{ sh -c {shlex.quote(command)}; rc=$?; rm -f "$f"; exit $rc; }}'
    )


def interrupt_step_script(fence: str = "") -> str:
    """Kill the step in progress (wait for one that is not killable); with `fence`, first stop
    every later step of that apply from running. Prints ``interrupted`` when a step was cut."""
    fence_cmd = ""
    if fence:  # next to where this node's steps keep their pid file (/run may be shared)
        fence_cmd = (
            f"ff={shlex.quote(STEP_FENCES[0])}; [ -d {STEP_DIR} ] || ff={shlex.quote(STEP_FENCES[1])}; "
            f'echo {shlex.quote(fence)} > "$ff"\n'
        )
    return fence_cmd + _INTERRUPT_LOOP


_INTERRUPT_LOOP = f"""\
for f in {shlex.quote(STEP_PIDFILE)} {shlex.quote(STEP_PIDFILE_NO_FRR)}; do
  set -- $(cat "$f" 2>/dev/null)
  p=${{1:-}}; how=${{2:-kill}}
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    if [ "$how" = wait ]; then
      while kill -0 "$p" 2>/dev/null; do sleep 0.5; done
    else
      kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
      i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
      kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
    fi
    echo interrupted
  fi
  rm -f "$f"
done
true
"""
INTERRUPT_STEP_SCRIPT = interrupt_step_script()
# After an interrupted step: FRR is stopped whatever state it was left in (never fails).
FRR_FORCE_STOP = f"{FRRINIT} stop >/dev/null 2>&1; true"


INSTALL_FRR_SCRIPT = """\
set -e
export DEBIAN_FRONTEND=noninteractive
# Keep the package's own frr.conf/daemons out of the way of the rendered ones.
for f in /etc/frr/frr.conf /etc/frr/daemons; do
  dpkg-divert --local --rename --divert "$f.dpkg-dist" --add "$f" >/dev/null
done
install() { apt-get -q -y -o DPkg::Lock::Timeout=300 install frr frr-pythontools >/dev/null; }
install || { apt-get -q update >/dev/null && install; }
test -x /usr/lib/frr/frrinit.sh
"""
