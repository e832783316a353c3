#!/usr/bin/env bash
# Run the whole test suite: lint, unit, integration against the real NATS + PostgreSQL, and the
# lab (NetBox, Redfish emulator, OpenSSH + FRR namespaces) where this machine allows it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase prints its time, so every CI log shows where a run's minutes went.
t_start=$SECONDS
phase() { echo "test: $1 (+$((SECONDS - t_start)) s)" >&2; }
source scripts/bootstrap-uv.sh
uv sync --locked --all-packages --quiet --compile-bytecode
# Our own packages are editable installs: compile them too (some machines set PYTHONDONTWRITEBYTECODE).
uv run --locked python -m compileall -q libs services cli >/dev/null
phase "environment synced"

# The real servers the integration tests use (CI machines run them already; start them if down).
if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && [ -x /usr/sbin/nats-server ] && [ "$(id -u)" = 0 ]; then
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null && command -v pg_ctlcluster >/dev/null && [ "$(id -u)" = 0 ]; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi

# Lab packages and peers (cached between runs on the machine).
if [ -x tests/lab/setup.sh ]; then
  tests/lab/setup.sh
fi
phase "lab packages present"
# The installers' caching proxy (apt-cacher-ng, cache kept on the machine): image builds and the
# Debian installer in a VM fetch through it.
cleanup=()
trap 'for c in "${cleanup[@]}"; do eval "$c" >/dev/null 2>&1 || true; done' EXIT
if [ -x tests/lab/aptproxy.sh ] && [ "$(id -u)" = 0 ] && command -v apt-cacher-ng >/dev/null; then
  if eval "$(tests/lab/aptproxy.sh up 2>/tmp/karios-aptproxy-up.log)"; then
    export KARIOS_APT_PROXY KARIOS_APT_MIRROR KARIOS_APT_SECURITY KARIOS_APT_BACKEND
    cleanup+=("tests/lab/aptproxy.sh down")
  else
    echo "test: installer proxy did not come up (tail of log below); install tests will report it" >&2
    tail -n 20 /tmp/karios-aptproxy-up.log >&2 || true
  fi
fi
phase "installer proxy up"
# NetBox comes up in the background while the tests start (minutes on a fresh machine: its venv is
# installed, its database restored from the committed seed, then cached by NetBox and PostgreSQL
# versions).
# The NetBox tests run `netbox.sh up` themselves, which waits on the lab's lock for this one.
if [ -x tests/lab/netbox.sh ] && [ -z "${KARIOS_SKIP_NETBOX:-}" ]; then
  (
    if tests/lab/netbox.sh up >/tmp/karios-netbox-up.log 2>&1; then
      echo "test: NetBox lab up (+$((SECONDS - t_start)) s)" >&2
    else
      echo "test: NetBox lab did not come up (tail of log below); NetBox contract tests will report it" >&2
      tail -n 30 /tmp/karios-netbox-up.log >&2 || true
    fi
  ) &
  cleanup+=("wait; tests/lab/netbox.sh down")
fi

# The image method's images (live environment, root archives and the OpenZFS modules of both Debian
# releases): built once and cached by content (tests/lab/images.sh) — ~10 minutes on a fresh
# machine (zfs-dkms compiles once per release), ~3 when only the trees changed (the compiled
# modules have a cache of their own), an instant when cached. Built here, before the
# tests: in the first VM test's fixture the build would count against that test's timeout.
if [ -x tests/lab/images.sh ] && [ "$(id -u)" = 0 ] && command -v mmdebstrap >/dev/null; then
  if ! tests/lab/images.sh >/tmp/karios-images.log 2>&1; then
    echo "test: the lab's images did not build (tail of log below); the install tests will report it" >&2
    tail -n 20 /tmp/karios-images.log >&2 || true
  fi
  phase "lab images built"
fi
uv run --locked ruff check .
uv run --locked ruff format --check .
phase "lint done"
# Parallel workers (pytest-xdist): tests/conftest.py groups what must run in turn (VMs, the
# FRR host-link lab) and sends the long chains first. KARIOS_TEST_WORKERS=0 runs in one process.
workers=${KARIOS_TEST_WORKERS:-4}
xdist=()
if [ "$workers" != 0 ]; then
  xdist=(-n "$workers" --dist loadscope --no-loadscope-reorder)
fi
status=0
export KARIOS_MEASURE_DIR="${KARIOS_MEASURE_DIR:-/tmp/karios-measures-$$}"
rm -rf "$KARIOS_MEASURE_DIR"
uv run --locked pytest "${xdist[@]}" "$@" || status=$?
phase "tests done (exit $status)"
# Tables the lab tests measured (e.g. the fabric matrix: time to Established and to a ping).
for f in "$KARIOS_MEASURE_DIR"/*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; cat "$f"; } >&2
done
exit "$status"
