#!/usr/bin/env bash
# deploy/compose run for real on one machine without a registry (docs/operations.md "Cluster").
#
#   tests/lab/compose.sh build    local images: Debian base (mmdebstrap, cached), uv, karios, nats, postgres, haproxy
#   tests/lab/compose.sh up       build what is missing, start the topology, wait until every container is healthy
#   tests/lab/compose.sh smoke    through the load balancer (127.0.0.1:8080): healthz, login, queue, write +
#                                 read back, R3 streams, then kill one NATS and one gateway: still answers
#   tests/lab/compose.sh down     stop and remove containers, networks and volumes
#   tests/lab/compose.sh ps       docker-compose ps
#
# Needs a running dockerd (docker.io) and docker-compose (v1.29, Debian). The images come from this
# machine only: a bookworm rootfs built with mmdebstrap (through tests/lab/aptproxy.sh when it is up)
# and `docker import`ed as karios-local/base:bookworm; the Python packages come from the PyPI mirror the
# host uses (builds run with the host network: dockerd here runs with --iptables=false). The
# observability services (prometheus, grafana, otel-collector, tempo) need registry images: they are
# left out (profile "observability" in compose.local.yaml).
# Cache: ${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/compose/ (base tarball, generated .env).
# Heavy steps (image builds, `up` until healthy) hold /tmp/karios-bench.lock (other benchmarks share the
# machine); KARIOS_BENCH_LOCK_HELD=1 when the caller holds it already.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DIR=$ROOT/deploy/compose
CACHE=${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/compose
BASE_TAR=$CACHE/base-bookworm.tar
BASE_IMAGE=karios-local/base:bookworm
UV_IMAGE=karios-local/uv:host
ENV_FILE=$CACHE/env
LOCK=/tmp/karios-bench.lock
PROJECT=${KARIOS_COMPOSE_PROJECT:-karios}
LB=${KARIOS_COMPOSE_LB:-http://127.0.0.1:8080}
BASE_PACKAGES=python3,python3-venv,postgresql-15,haproxy,ca-certificates,wget

log() { printf '[compose %6.1fs] %s\n' "$SECONDS" "$*" >&2; }
dc() { docker-compose -p "$PROJECT" --env-file "$ENV_FILE" -f "$DIR/compose.yaml" -f "$DIR/compose.local.yaml" "$@"; }
# Run "$@" holding the benchmark lock; logs how long it waited for the lock and how long "$@" ran.
# KARIOS_BENCH_LOCK_HELD=1: the caller already holds it (flock /tmp/karios-bench.lock compose.sh ...).
locked() {
  local t0=$SECONDS rc=0
  if [ -n "${KARIOS_BENCH_LOCK_HELD:-}" ]; then
    "$@" || rc=$?
    log "done in $((SECONDS - t0))s (rc $rc): $1 ${2:-}"
    return $rc
  fi
  exec 9>>"$LOCK"
  flock 9
  log "lock after $((SECONDS - t0))s: $1 ${2:-}"
  t0=$SECONDS
  "$@" || rc=$?
  flock -u 9
  exec 9>&-
  log "done in $((SECONDS - t0))s (rc $rc): $1 ${2:-}"
  return $rc
}

# Secrets for this lab only, generated once, never printed.
ensure_env() {
  mkdir -p "$CACHE"
  [ -s "$ENV_FILE" ] && return
  (
    umask 077
    {
      echo "KARIOS_SECRET_KEY=$(head -c 32 /dev/urandom | base64)"
      echo "KARIOS_BOOTSTRAP_ADMIN_TOKEN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
      echo "KARIOS_PROVISIONER_MEDIA_URL=http://127.0.0.1:8082"
    } >"$ENV_FILE"
  )
}

build_base() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then return; fi
  mkdir -p "$CACHE"
  if [ ! -s "$BASE_TAR" ]; then
    local proxy="" env_lines
    if env_lines=$(tests/lab/aptproxy.sh up 2>/dev/null); then
      proxy=$(printf '%s\n' "$env_lines" | sed -n 's/^KARIOS_APT_PROXY=//p')
    fi
    log "mmdebstrap bookworm ($BASE_PACKAGES)${proxy:+ via $proxy}"
    # The host's extra CAs (this machine reaches PyPI through a TLS-inspecting egress) are trusted
    # in the base too, so `uv sync` inside the build reaches the same mirror the host uses.
    locked mmdebstrap --variant=apt --include="$BASE_PACKAGES" \
      ${proxy:+--aptopt="Acquire::http::Proxy \"$proxy\""} \
      --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"; chroot "$1" update-ca-certificates >/dev/null; fi' \
      --customize-hook='rm -rf "$1"/var/lib/postgresql/15/main "$1"/etc/postgresql/15/main "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
      bookworm "$CACHE/base-bookworm.tmp.tar" http://deb.debian.org/debian
    mv "$CACHE/base-bookworm.tmp.tar" "$BASE_TAR"
    log "base tarball $(du -h "$BASE_TAR" | cut -f1)"
  fi
  docker import --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["/bin/bash"]' "$BASE_TAR" "$BASE_IMAGE" >/dev/null
  log "imported $BASE_IMAGE"
}

# The uv binary this host uses, as the image the Dockerfile copies /uv from (ARG UV_IMAGE).
build_uv() {
  if docker image inspect "$UV_IMAGE" >/dev/null 2>&1; then return; fi
  local uv tmp
  uv=$(command -v uv || echo "$HOME/.local/bin/uv")
  tmp=$(mktemp -d)
  cp "$uv" "$tmp/uv"
  tar -C "$tmp" -cf - uv | docker import - "$UV_IMAGE" >/dev/null
  rm -rf "$tmp"
  log "imported $UV_IMAGE ($("$uv" --version))"
}

build() {
  command -v docker-compose >/dev/null || { echo "docker-compose missing: apt-get install docker-compose" >&2; exit 1; }
  docker info >/dev/null 2>&1 || { echo "dockerd is not running (dockerd --iptables=false --ip-forward=false &)" >&2; exit 1; }
  ensure_env
  build_base
  build_uv
  locked build_images
}

# The karios image first: the local nats image takes nats-server from it.
build_images() {
  dc build api-gateway >&2
  dc build >&2
}

# Every container of the project (observability left out) reports healthy, or has no health check.
wait_healthy() {
  local deadline=$((SECONDS + ${1:-300})) ids bad
  while :; do
    ids=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT")
    bad=$(for id in $ids; do
      docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
    done | grep -v -E ' (healthy|running)$' || true)
    if [ -n "$ids" ] && [ -z "$bad" ]; then return 0; fi
    if [ $SECONDS -ge $deadline ]; then
      echo "not healthy after ${1:-300}s:" >&2
      echo "$bad" >&2
      return 1
    fi
    sleep 2
  done
}

# One row of the smoke table: check, result, detail.
ROWS=()
row() { ROWS+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")"); printf '%-34s %-5s %s\n' "$1" "$2" "$3" >&2; }
FAILED=0
check() { # check NAME OK? DETAIL
  if [ "$2" = 1 ]; then row "$1" ok "$3"; else row "$1" FAIL "$3"; FAILED=1; fi
}

# curl through the load balancer: prints "<status> <seconds>" and leaves the body in $BODY_FILE.
BODY_FILE=$(mktemp)
trap 'rm -f "$BODY_FILE"' EXIT
api() { # api METHOD PATH [TOKEN] [JSON]
  local args=(-s -o "$BODY_FILE" -w '%{http_code} %{time_total}' -m 20 -X "$1")
  [ -n "${3:-}" ] && args+=(-H "Authorization: Bearer $3")
  [ -n "${4:-}" ] && args+=(-H 'Content-Type: application/json' --data "$4")
  curl "${args[@]}" "$LB$2" || true
}
# A jq view of the last body (the raw start of it when it is not JSON).
body() { jq -c "$1" "$BODY_FILE" 2>/dev/null || head -c 120 "$BODY_FILE"; }

# JetStream streams seen from inside a karios container (nats-py, the three cluster URLs).
STREAMS_PY='
import asyncio, json, os
import nats
async def main():
    nc = await nats.connect(os.environ["KARIOS_NATS_URL"].split(","), connect_timeout=3, max_reconnect_attempts=2)
    out = []
    for s in await nc.jetstream().streams_info():
        c = s.cluster
        peers = [c.leader] + [r.name for r in (c.replicas or []) if r.current] if c else []
        out.append({"stream": s.config.name, "replicas": s.config.num_replicas, "leader": c.leader if c else None,
                    "current": len(peers), "messages": s.state.messages})
    print(json.dumps(out))
    await nc.close()
asyncio.run(main())
'
container() { docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1" --filter "label=com.docker.compose.container-number=${2:-1}"; }
streams() { docker exec "$(container api-gateway "${1:-1}")" python -c "$STREAMS_PY"; }

# N requests through the load balancer while something is down: "<ok>/<n> max <s>s".
burst() { # burst N PATH TOKEN
  local n=$1 ok=0 max=0 i out code t
  for ((i = 0; i < n; i++)); do
    out=$(api GET "$2" "$3"); code=${out% *}; t=${out#* }
    [ "$code" = 200 ] && ok=$((ok + 1))
    max=$(awk -v a="$max" -v b="$t" 'BEGIN{print (b > a) ? b : a}')
    sleep 0.25
  done
  echo "$ok/$n max ${max}s"
}

smoke() {
  ensure_env
  local token out code nodes r3 rsum before after bmc=10.250.0.$((RANDOM % 200 + 10))
  token=$(sed -n 's/^KARIOS_BOOTSTRAP_ADMIN_TOKEN=//p' "$ENV_FILE")
  out=$(api GET /healthz); check "GET /healthz" "$([ "${out% *}" = 200 ] && echo 1)" "$out"
  out=$(api GET /controlnode/provision/queue); check "queue without token -> 401" "$([ "${out% *}" = 401 ] && echo 1)" "$out"
  out=$(api GET /controlnode/tokens/self "$token")
  check "login: bootstrap admin token" "$([ "${out% *}" = 200 ] && echo 1)" "$out $(body .)"
  out=$(api GET /controlnode/provision/queue "$token")
  check "GET /controlnode/provision/queue" "$([ "${out% *}" = 200 ] && echo 1)" "$out $(body '{queued,active}')"
  out=$(api POST /controlnode/register "$token" "{\"bmc_ip\":\"$bmc\",\"os_hostname\":\"smoke-${bmc##*.}\",\"os_ip\":\"10.251.0.${bmc##*.}\"}")
  check "POST /controlnode/register $bmc" "$([ "${out% *}" = 200 ] && echo 1)" "$out $(body '{created,node_ip,hostname}')"
  out=$(api GET "/controlnode/nodes?limit=1000" "$token")
  nodes=$(jq -r --arg ip "10.251.0.${bmc##*.}" '[.items[]? | select(.node_ip == $ip)] | length' "$BODY_FILE" 2>/dev/null || echo 0)
  check "read back GET /controlnode/nodes" "$([ "${out% *}" = 200 ] && [ "$nodes" = 1 ] && echo 1)" "$out node 10.251.0.${bmc##*.} listed: $nodes"
  out=$(api POST /controlnode/tokens "$token" "{\"name\":\"smoke-$bmc\",\"role\":\"viewer\"}")
  local viewer; viewer=$(jq -r '.token // empty' "$BODY_FILE" 2>/dev/null || true)
  check "POST /controlnode/tokens (viewer)" "$([ "${out% *}" = 201 ] && echo 1)" "$out"
  out=$(burst 4 /controlnode/tokens/self "$viewer")
  check "new token on every gateway replica" "$([ "${out%%/*}" = 4 ] && echo 1)" "$out"

  r3=$(streams 1 || echo '[]')
  rsum=$(jq -r '[.[] | "\(.stream)=R\(.replicas)/\(.current)"] | join(" ")' <<<"$r3")
  check "JetStream streams R3, 3 current" "$(jq -e 'length > 0 and all(.replicas == 3 and .current == 3)' <<<"$r3" >/dev/null && echo 1)" "$rsum"

  # Take one NATS server and one gateway replica away (docker kill: stays down until started).
  local nats1 gw1
  nats1=$(container nats-1); gw1=$(container api-gateway 1)
  docker kill "$nats1" "$gw1" >/dev/null
  check "docker kill nats-1 + api-gateway_1" 1 "$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l) containers still up"
  out=$(burst 20 /controlnode/provision/queue "$token")
  check "queue while both are down (20 req)" "$([ "${out%%/*}" = 20 ] && echo 1)" "$out"
  out=$(api POST /controlnode/register "$token" "{\"bmc_ip\":\"$bmc\",\"os_hostname\":\"smoke-${bmc##*.}b\",\"os_ip\":\"10.251.0.${bmc##*.}\"}")
  check "write while both are down" "$([ "${out% *}" = 200 ] && echo 1)" "$out $(body '{created,hostname}')"
  r3=$(streams 2 || echo '[]')
  rsum=$(jq -r '[.[] | "\(.stream)=R\(.replicas)/\(.current) leader \(.leader)"] | join(" ")' <<<"$r3")
  check "streams with nats-1 down (>=2 current)" "$(jq -e 'length > 0 and all(.replicas == 3 and .current >= 2)' <<<"$r3" >/dev/null && echo 1)" "$rsum"

  docker start "$nats1" "$gw1" >/dev/null
  local t0=$SECONDS
  if wait_healthy 180; then
    check "nats-1 + api-gateway_1 started again" 1 "all healthy after $((SECONDS - t0))s"
  else
    check "nats-1 + api-gateway_1 started again" 0 "not healthy after 180s"
  fi
  r3=$(streams 1 || echo '[]')
  check "streams R3 after restart" "$(jq -e 'length > 0 and all(.replicas == 3 and .current == 3)' <<<"$r3" >/dev/null && echo 1)" \
    "$(jq -r '[.[] | "\(.stream)=R\(.replicas)/\(.current)"] | join(" ")' <<<"$r3")"
  api DELETE "/controlnode/tokens/smoke-$bmc" "$token" >/dev/null

  echo
  echo "compose smoke ($PROJECT, $LB):"
  printf '%s\n' "${ROWS[@]}"
  return $FAILED
}

# Every local image is there (build again explicitly with `compose.sh build`).
images_present() {
  local i
  for i in "$BASE_IMAGE" "$UV_IMAGE" karios-local/karios:dev karios-local/nats:dev karios-local/postgres:dev karios-local/haproxy:dev; do
    docker image inspect "$i" >/dev/null 2>&1 || return 1
  done
}

up() {
  ensure_env
  images_present || build
  locked start_and_wait
  dc ps >&2
}

# --compatibility: docker-compose v1 honours deploy.replicas only with it.
start_and_wait() {
  local t0=$SECONDS
  dc --compatibility up -d --no-build >&2
  wait_healthy 300
  log "all $(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l) containers healthy $((SECONDS - t0))s after up"
  wait_lb 120
  log "load balancer answers /readyz on 8080-8082 $((SECONDS - t0))s after up"
}

# haproxy finds the replicas through Docker's DNS and marks each one up after two good checks
# (inter 2s): "healthy" in Docker comes first. Wait until every frontend answers /readyz, then
# two more check intervals so the second replica of each backend is up too.
wait_lb() {
  local deadline=$((SECONDS + ${1:-120})) port base=${LB%:*}
  for port in 8080 8081 8082; do
    until [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$base:$port/readyz" || true)" = 200 ]; do
      if [ $SECONDS -ge $deadline ]; then echo "load balancer: $base:$port/readyz not 200" >&2; return 1; fi
      sleep 1
    done
  done
  sleep 5
}

down() {
  [ -s "$ENV_FILE" ] || ensure_env
  dc --profile observability down -v --remove-orphans >&2
}

case "${1:-}" in
base) build_base ;;
build) build ;;
up) up ;;
smoke) smoke ;;
down) down ;;
ps) dc ps ;;
*) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
