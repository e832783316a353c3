#!/usr/bin/env bash
# The installers' caching proxy: apt-cacher-ng on 127.0.0.1:3142 in front of this machine's Debian mirror.
#
#   tests/lab/aptproxy.sh up       start (or reuse the running one); prints the env lines below
#   tests/lab/aptproxy.sh down     stop the instance this script started
#   tests/lab/aptproxy.sh env      print the env lines (exit 1 if not up)
#   tests/lab/aptproxy.sh status   exit 0 if up and answering
#
#   eval "$(tests/lab/aptproxy.sh up)"     # stdout is only the env lines; progress goes to stderr
#
# Env lines:
#   KARIOS_APT_PROXY=http://127.0.0.1:3142            an HTTP proxy: apt/d-i/mmdebstrap keep their usual
#                                                     mirror URL (http://deb.debian.org/debian) and set
#                                                     Acquire::http::Proxy / mirror/http/proxy to this
#   KARIOS_APT_MIRROR=http://127.0.0.1:3142/debian    the same archive as a plain mirror URL (no proxy)
#   KARIOS_APT_SECURITY=http://127.0.0.1:3142/debian-security
#   KARIOS_APT_BACKEND=<the upstream Debian URL it forwards to>
#
# Both forms work because the Debian remap accepts the virtual path /debian *and* every known Debian
# mirror host name (apt-cacher-ng's deb_mirrors list, deb.debian.org among them); `ForceManaged: 1`
# refuses anything else, so a guest can't use it to reach other hosts.
# Backend: the first `/debian` URL in /etc/apt/sources.list.d/* (deb822 `URIs:` or one-line `deb`),
# then /etc/apt/sources.list; override with KARIOS_APT_BACKEND. Security: the `/debian-security` URL
# found the same way (else http://deb.debian.org/debian-security).
# Cache (${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/apt-cacher-ng) is kept between runs: packages come
# from it, index files are re-checked upstream. Run dir: ${KARIOS_LAB_RUN:-/tmp/karios-lab}/aptproxy
# (conf/, pid, log/). Port: KARIOS_APT_PROXY_PORT (default 3142), bound to 127.0.0.1 only.
set -euo pipefail

PORT=${KARIOS_APT_PROXY_PORT:-3142}
HOST=127.0.0.1
CACHE_DIR=${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/apt-cacher-ng
RUN_DIR=${KARIOS_LAB_RUN:-/tmp/karios-lab}/aptproxy
CONF_DIR=$RUN_DIR/conf
PID_FILE=$RUN_DIR/apt-cacher-ng.pid
LOG_DIR=$RUN_DIR/log
START_TIMEOUT=${KARIOS_APT_PROXY_START_TIMEOUT:-30}

log() { echo "aptproxy: $*" >&2; }

# The first source URL whose path ends in $1 (e.g. /debian), from deb822 and one-line sources.
source_url() {
  local suffix=$1 f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -r "$f" ] || continue
    awk -v suf="$suffix" '
      /^[[:space:]]*#/ { next }
      tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i; next }
      $1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }
    ' "$f" | sed 's:/*$::' | while read -r u; do
      case "$u" in http://*"$suffix") echo "$u"; break ;; esac
    done
  done | head -n1
}

backend() { echo "${KARIOS_APT_BACKEND:-$(source_url /debian)}"; }
security_backend() { local s; s=$(source_url /debian-security); echo "${s:-http://deb.debian.org/debian-security}"; }

print_env() {
  echo "KARIOS_APT_PROXY=http://$HOST:$PORT"
  echo "KARIOS_APT_MIRROR=http://$HOST:$PORT/debian"
  echo "KARIOS_APT_SECURITY=http://$HOST:$PORT/debian-security"
  echo "KARIOS_APT_BACKEND=$(cat "$CONF_DIR/backends_debian" 2>/dev/null || backend)"
}

# Up = something on the port answers the Debian remap (a Release file through /debian).
answering() {
  curl -fsS -m 20 -o /dev/null "http://$HOST:$PORT/debian/dists/bookworm/Release" 2>/dev/null
}

our_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_conf() {
  local be sec
  be=$(backend)
  [ -n "$be" ] || { log "no http://…/debian source in /etc/apt/sources.list.d/* (set KARIOS_APT_BACKEND)"; exit 1; }
  sec=$(security_backend)
  mkdir -p "$CONF_DIR" "$CACHE_DIR" "$LOG_DIR"
  echo "$be/" >"$CONF_DIR/backends_debian"
  echo "$sec/" >"$CONF_DIR/backends_debian_security"
  cat >"$CONF_DIR/acng.conf" <<EOF
# written by tests/lab/aptproxy.sh — regenerated on every start
CacheDir: $CACHE_DIR
LogDir: $LOG_DIR
SupportDir: /usr/lib/apt-cacher-ng
Port: $PORT
BindAddress: $HOST
PidFile: $PID_FILE
Remap-debrep: file:deb_mirror*.gz /debian ; file:backends_debian
Remap-secdeb: security.debian.org security.debian.org/debian-security deb.debian.org/debian-security /debian-security ; file:backends_debian_security
ForceManaged: 1
ExThreshold: 4
ReportPage: acng-report.html
EOF
  log "backend $be (security $sec), cache $CACHE_DIR"
}

cmd_up() {
  if answering; then
    log "already up on $HOST:$PORT (reused)"
    print_env
    return 0
  fi
  command -v apt-cacher-ng >/dev/null || { log "apt-cacher-ng is not installed (tests/lab/setup.sh installs it)"; exit 1; }
  if pid=$(our_pid); then
    log "pid $pid is not answering; restarting"
    kill "$pid" 2>/dev/null || true
  fi
  if (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; then
    log "$HOST:$PORT is taken by something that does not serve /debian"
    exit 1
  fi
  write_conf
  rm -f "$PID_FILE"
  # Detaches itself (ForeGround: 0) and writes PidFile.
  apt-cacher-ng -c "$CONF_DIR" ForeGround=0 >"$LOG_DIR/start.log" 2>&1 || {
    log "apt-cacher-ng failed to start:"
    cat "$LOG_DIR/start.log" >&2
    exit 1
  }
  local deadline=$((SECONDS + START_TIMEOUT))
  until answering; do
    if [ $SECONDS -ge $deadline ]; then
      log "not answering on $HOST:$PORT after ${START_TIMEOUT}s; logs in $LOG_DIR"
      tail -n 20 "$LOG_DIR"/apt-cacher.err >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
  log "up on $HOST:$PORT (pid $(cat "$PID_FILE" 2>/dev/null))"
  print_env
}

cmd_down() {
  local pid
  if pid=$(our_pid); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    log "stopped pid $pid"
  else
    log "not running (nothing started by this script)"
  fi
  rm -f "$PID_FILE"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) answering || { log "not up"; exit 1; }; print_env ;;
  status) answering ;;
  *) echo "usage: $0 up|down|env|status" >&2; exit 2 ;;
esac
