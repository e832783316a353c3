#!/usr/bin/env bash
# A real NetBox 4.7.3 on 127.0.0.1 for contract tests.
#
#   tests/lab/netbox.sh up [--with-worker] [--fresh]   start (or re-print env if already up)
#   tests/lab/netbox.sh down                            stop runserver (and worker)
#   tests/lab/netbox.sh env                             print NETBOX_URL=... / NETBOX_TOKEN=...
#   tests/lab/netbox.sh status                          exit 0 if up and answering
#   tests/lab/netbox.sh python                          print the Python >= 3.12 it would use (building it if needed)
#   tests/lab/netbox.sh seed                            regenerate tests/lab/netbox-seed/ (after a NETBOX_VERSION change)
#
#   eval "$(tests/lab/netbox.sh up)"      # stdout is only the env lines; progress goes to stderr
#   set -a; eval "$(tests/lab/netbox.sh env)"; set +a    # to export them
#
# Cache (${KARIOS_LAB_CACHE:-/var/cache/karios-lab}):
#   cpython-3.13/                 CPython built from Debian trixie source (only when no usable Python >= 3.12)
#   netbox-4.7.3/python           path of the interpreter chosen for the venv
#   netbox-4.7.3/venv/            venv with netbox==4.7.3 (.karios-ready marks a finished install)
#   netbox-4.7.3/db-pgNN/         netbox.dump (pg_dump -Fc of a migrated DB that already holds the
#                                 superuser admin/admin and its API token), token, secrets.env
#                                 (SECRET_KEY and the token pepper the token's digest depends on).
#                                 Keyed by the PostgreSQL server major version.
# Run dir (${KARIOS_LAB_RUN:-/tmp/karios-lab}/netbox): root/ (NETBOX_ROOT, holds conf/configuration.py),
#   runserver.{pid,log}, rqworker.{pid,log}, token, env.
#
# Every `up` that starts NetBox drops database karios_netbox and recreates it from the dump (via a
# template database restored from the dump once per cluster, see restore_db), and flushes NetBox's
# two Redis databases, so each test run starts from the same clean state. `up` while already up
# leaves the running instance alone; `up --fresh` restarts it from the clean state.
# Delete netbox-4.7.3/db-pgNN/ to force a re-migration.
# Python: first usable of python3.13/python3.12 on PATH (failing pyenv shims are skipped),
# /root/.pyenv/versions/3.13*/bin/python3, .../3.12*/bin/python3, a previously built
# $KARIOS_LAB_CACHE/cpython-3.13, Debian 13's /usr/bin/python3.13 (+ python3.13-venv/-dev), else a
# CPython 3.13 build from Debian trixie's source package (the Debian 12 case).
#
# How webhooks get delivered (read from the 4.7.3 wheel: extras/events.py, extras/event_rules.py,
# extras/webhooks.py, core/management/commands/rqworker.py):
#   1. An API/UI write records an event (object_created/updated/deleted) in a per-request queue.
#   2. When the request finishes, EVENTS_PIPELINE (extras.events.process_event_queue) matches the events
#      against enabled EventRules (object_types + event_types + conditions).
#   3. For a rule with action_type "webhook", WebhookAction.enqueue() pushes the job
#      extras.webhooks.send_webhook onto the RQ queue "default" (QUEUE_MAPPINGS['webhook'] overrides it)
#      in Redis -- REDIS['tasks'], db $REDIS_TASKS_DB here. runserver itself never sends anything.
#   4. `netbox rqworker` (listens on high, default, low) pops the job and does the HTTP request
#      (payload rendered from the webhook's body template, X-Hook-Signature if a secret is set,
#      retried per RQ_RETRY_* settings).
#   So webhook tests need `up --with-worker`; without a worker the jobs just sit in Redis (and are
#   flushed by the next `up`). The worker also runs other background jobs: scripts, data source
#   syncs, and custom-field provisioning/purge when a field touches more than BULK_UPDATE_CHUNK_SIZE
#   (5000) objects (smaller ones are done inline in the request). `netbox webhook_receiver --port N`
#   is a built-in receiver that prints what it gets.
set -euo pipefail

NETBOX_VERSION=4.7.3
NETBOX_PORT=${NETBOX_PORT:-8765}
NETBOX_HOST=127.0.0.1
NETBOX_START_TIMEOUT=${NETBOX_START_TIMEOUT:-180}
CACHE_ROOT=${KARIOS_LAB_CACHE:-/var/cache/karios-lab}
CACHE_DIR=$CACHE_ROOT/netbox-$NETBOX_VERSION
RUN_DIR=${KARIOS_LAB_RUN:-/tmp/karios-lab}/netbox
NETBOX_ROOT=$RUN_DIR/root
VENV=$CACHE_DIR/venv
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SEED_DUMP=$LAB_DIR/netbox-seed/netbox-$NETBOX_VERSION.dump
PG_HOST=127.0.0.1
PG_PORT=5432
PG_USER=postgres
DB_NAME=${KARIOS_NETBOX_DB:-karios_netbox}
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
REDIS_TASKS_DB=${KARIOS_NETBOX_REDIS_TASKS_DB:-14}
REDIS_CACHE_DB=${KARIOS_NETBOX_REDIS_CACHE_DB:-15}
# KARIOS_LAB_PYTHON: a path to force an interpreter, or "build" to force the CPython source build.
FORCE_PYTHON=${KARIOS_LAB_PYTHON:-}

export PGHOST=$PG_HOST PGPORT=$PG_PORT PGUSER=$PG_USER PGCONNECT_TIMEOUT=5
export NETBOX_ROOT
# Never let NetBox (webhooks, runserver) route 127.0.0.1 through a proxy.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

T0=${EPOCHREALTIME/[.,]/}
log() { local now=${EPOCHREALTIME/[.,]/}; printf '[netbox-lab %6.1fs] %s\n' "$(( (now - T0) / 100000 ))e-1" "$*" >&2; }
die() { printf '[netbox-lab] ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=(sudo); fi

apt_install() {  # installs only what is missing, so the apt lock is not taken for nothing
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    log "apt-get install ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
        || { "${SUDO[@]}" apt-get update >&2 \
             && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL and Redis (shared services: started if down, never stopped by this script)

pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }

ensure_postgres() {
    command -v pg_isready >/dev/null || apt_install postgresql-client
    if ! pg_up; then
        [ -d /etc/postgresql ] || die "PostgreSQL is not answering on $PG_HOST:$PG_PORT and no cluster exists in /etc/postgresql"
        local ver
        ver=$(ls /etc/postgresql | sort -V | tail -n1)
        log "starting PostgreSQL $ver"
        "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2 || true
        for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
        pg_up || die "PostgreSQL did not come up on $PG_HOST:$PG_PORT"
    fi
    psql -w -d postgres -Atqc 'select 1' >/dev/null \
        || die "cannot connect to PostgreSQL as $PG_USER on $PG_HOST:$PG_PORT without a password (trust auth expected)"
}

pg_major() { psql -w -d postgres -Atqc 'show server_version_num' | cut -c1-2; }

# Minimal Redis client over bash's /dev/tcp: sends inline commands, prints one reply line each.
redis_cmds() {
    (
        exec 3<>"/dev/tcp/$REDIS_HOST/$REDIS_PORT" || exit 1
        printf '%s\r\n' "$@" >&3
        for _ in "$@"; do IFS= read -r -t 3 line <&3 || exit 1; printf '%s\n' "${line%$'\r'}"; done
    ) 2>/dev/null
}
redis_up() { [ "$(redis_cmds PING)" = "+PONG" ]; }

ensure_redis() {
    redis_up && return 0
    command -v redis-server >/dev/null || apt_install redis-server
    # The package's postinst may have started it already.
    redis_up && return 0
    log "starting redis-server on $REDIS_HOST:$REDIS_PORT"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no >&2
    for _ in $(seq 1 50); do redis_up && return 0; sleep 0.1; done
    die "Redis did not come up on $REDIS_HOST:$REDIS_PORT"
}

# ---------------------------------------------------------------------------------------------
# Python >= 3.12

# Prints the real interpreter path if $1 is a usable Python >= 3.12 (pyenv shims that fail are rejected).
py_check() {
    "$1" - <<'EOF' 2>/dev/null
import sys
if sys.version_info < (3, 12):
    sys.exit(1)
import ensurepip, ssl, sqlite3, venv, ctypes, lzma, bz2, zlib  # noqa: F401  (venv + pip + netbox needs)
print(sys.executable)
EOF
}

# Debian's own python3.1x splits ensurepip (python3.1x-venv) and headers (python3.1x-dev) out.
py_debian_repair() {
    local p=$1 minor
    case "$p" in /usr/bin/python3.1[2-9]) ;; *) return 1 ;; esac
    minor=${p#/usr/bin/python}
    "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null || return 1
    apt_install "python$minor-venv" "python$minor-dev" >/dev/null || return 1
    py_check "$p"
}

# CPython 3.13 from Debian trixie's *source* package (binary trixie packages need trixie's glibc).
# Private apt state so the system's sources and lists are left alone. ~3 min on 2 cores.
build_cpython() {
    local prefix=$CACHE_ROOT/cpython-3.13 work mirror
    if [ -x "$prefix/bin/python3.13" ] && py_check "$prefix/bin/python3.13" >/dev/null; then
        echo "$prefix/bin/python3.13"; return 0
    fi
    log "no Python >= 3.12 found: building CPython 3.13 from Debian trixie source into $prefix"
    apt_install build-essential ca-certificates xz-utils libssl-dev zlib1g-dev libffi-dev libsqlite3-dev \
        libbz2-dev liblzma-dev libreadline-dev uuid-dev libncurses-dev libgdbm-dev libexpat1-dev libpq-dev >/dev/null
    mirror=$(grep -hoE '^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
                 /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
             | grep -oE 'https?://[^[:space:]]+' | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    work=$(mktemp -d /tmp/karios-cpython.XXXXXX)
    chmod 755 "$work"   # apt downloads as user _apt
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/apt/parts" "$work/src"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} trixie main" >"$work/apt/sources.list"
    local aptopts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
                   -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache")
    apt-get "${aptopts[@]}" update >&2
    (cd "$work" && apt-get "${aptopts[@]}" source --download-only python3.13 >&2)
    # The upstream tarball is enough: Debian's patches are about Debian's own layout.
    tar -xf "$(find "$work" -maxdepth 1 -name 'python3.13_*.orig.tar.*' ! -name '*.asc' | head -n1)" -C "$work/src"
    local srcdir
    srcdir=$(ls -d "$work"/src/*/ | head -n1)
    (cd "$srcdir" && ./configure --prefix="$prefix" --with-ensurepip=install --disable-test-modules >&2 \
        && make -j"$(nproc)" >&2 && make install >&2) || die "CPython build failed (sources in $work)"
    rm -rf "$work"
    py_check "$prefix/bin/python3.13" || die "built CPython at $prefix is not usable"
}

find_python() {
    local c p
    if [ -n "$FORCE_PYTHON" ]; then
        if [ "$FORCE_PYTHON" = build ]; then build_cpython; return; fi
        py_check "$FORCE_PYTHON" || die "KARIOS_LAB_PYTHON=$FORCE_PYTHON is not a usable Python >= 3.12"
        return
    fi
    for c in python3.13 python3.12; do
        p=$(command -v "$c" 2>/dev/null) || continue
        py_check "$p" && return 0
    done
    for p in $(ls -d /root/.pyenv/versions/3.13*/bin/python3 2>/dev/null | sort -rV) \
             $(ls -d /root/.pyenv/versions/3.12*/bin/python3 2>/dev/null | sort -rV) \
             "$CACHE_ROOT/cpython-3.13/bin/python3.13"; do
        [ -x "$p" ] && py_check "$p" && return 0
    done
    for p in /usr/bin/python3.13 /usr/bin/python3.12; do   # Debian 13: present but without -venv/-dev
        [ -x "$p" ] && py_debian_repair "$p" && return 0
    done
    build_cpython
}

# ---------------------------------------------------------------------------------------------
# venv with netbox==4.7.3 (its wheel installs top-level packages core/, utilities/, ...: keep it alone)

ensure_venv() {
    if [ -f "$VENV/.karios-ready" ] && "$VENV/bin/python" -c '' 2>/dev/null; then return 0; fi
    local py
    py=$(cat "$CACHE_DIR/python" 2>/dev/null || true)
    if [ -z "$py" ] || [ -n "$FORCE_PYTHON" ] || ! py_check "$py" >/dev/null; then
        py=$(find_python) || die "no usable Python >= 3.12"
        echo "$py" >"$CACHE_DIR/python"
    fi
    log "creating venv with $py ($("$py" -V 2>&1))"
    # psycopg[c] is compiled from source: needs a C compiler, libpq headers and pg_config.
    if ! command -v pg_config >/dev/null || ! command -v cc >/dev/null; then
        apt_install gcc libc6-dev libpq-dev >/dev/null
    fi
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    log "pip install netbox==$NETBOX_VERSION (~1-2 min)"
    if ! "$VENV/bin/pip" install --disable-pip-version-check -q "netbox==$NETBOX_VERSION" 2>&1 \
            | sed '/^WARNING: Location .* is ignored/d' >&2; then
        die "pip install netbox==$NETBOX_VERSION failed"
    fi
    [ "$("$VENV/bin/netbox" version)" = "$NETBOX_VERSION" ] || die "installed netbox is not $NETBOX_VERSION"
    touch "$VENV/.karios-ready"
}

# ---------------------------------------------------------------------------------------------
# Configuration. settings.py (wheel mode, detected by netbox/_data existing) resolves NETBOX_ROOT from
# the environment (default /opt/netbox) and loads $NETBOX_ROOT/conf/configuration.py by file path;
# NETBOX_CONFIGURATION=<module> would override that. MEDIA/REPORTS/SCRIPTS/STATIC roots default to
# subdirectories of NETBOX_ROOT. So every netbox command below runs with NETBOX_ROOT exported.

gen_secret() {  # $1 alphanumeric characters
    "$VENV/bin/python" -c 'import secrets, string, sys
print("".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(int(sys.argv[1]))))' "$1"
}

write_secrets() {  # $1 = secrets.env to write: this machine's SECRET_KEY and token pepper
    printf "SECRET_KEY='%s'\nAPI_TOKEN_PEPPER='%s'\n" "$(gen_secret 64)" "$(gen_secret 64)" >"$1"
}

write_config() {  # $1 = secrets.env
    # shellcheck disable=SC1090
    . "$1"
    mkdir -p "$NETBOX_ROOT/conf" "$NETBOX_ROOT/media" "$NETBOX_ROOT/scripts" "$NETBOX_ROOT/reports"
    : >"$NETBOX_ROOT/conf/__init__.py"
    cat >"$NETBOX_ROOT/conf/configuration.py.tmp" <<EOF
# Generated by tests/lab/netbox.sh -- Karios contract-test lab, 127.0.0.1 only.
ALLOWED_HOSTS = ['127.0.0.1', 'localhost']
DATABASES = {
    'default': {
        'ENGINE': 'django.db.backends.postgresql',
        'NAME': '$DB_NAME',
        'USER': '$PG_USER',
        'PASSWORD': '',
        'HOST': '$PG_HOST',
        'PORT': $PG_PORT,
        'CONN_MAX_AGE': 300,
    }
}
REDIS = {
    'tasks': {'HOST': '$REDIS_HOST', 'PORT': $REDIS_PORT, 'USERNAME': '', 'PASSWORD': '',
              'DATABASE': $REDIS_TASKS_DB, 'SSL': False},
    'caching': {'HOST': '$REDIS_HOST', 'PORT': $REDIS_PORT, 'USERNAME': '', 'PASSWORD': '',
                'DATABASE': $REDIS_CACHE_DB, 'SSL': False},
}
SECRET_KEY = '$SECRET_KEY'
API_TOKEN_PEPPERS = {1: '$API_TOKEN_PEPPER'}
TIME_ZONE = 'UTC'
# No traffic off the machine: no census, no release check, no plugin catalog.
CENSUS_REPORTING_ENABLED = False
ISOLATED_DEPLOYMENT = True
RELEASE_CHECK_URL = None
EOF
    mv "$NETBOX_ROOT/conf/configuration.py.tmp" "$NETBOX_ROOT/conf/configuration.py"
}

# ---------------------------------------------------------------------------------------------
# Database: built once per NetBox version and PostgreSQL major (netbox migrate, 5-7 min), then
# recreated from the dump on every up (template clone, 0.3-2 s).

migrate_db() {
    "$VENV/bin/netbox" migrate --no-input >"$RUN_DIR/migrate.log" 2>&1 \
        || { tail -n 40 "$RUN_DIR/migrate.log" >&2; die "netbox migrate failed (log: $RUN_DIR/migrate.log)"; }
}

# The seed: NetBox's migrated schema as `netbox migrate` leaves it on an empty database (its own
# rows: content types, permissions, migrations applied), before any user, token or secret exists.
# A fresh machine restores it (~6 s) instead of migrating (5-7 min of a core, ~17 min beside the
# tests). Regenerated by `netbox.sh seed` when NETBOX_VERSION changes; a seed of another version is
# never used (its name carries the version), and one that misses a migration is completed by
# migrate (build_db_cache checks with migrate --check).
cmd_seed() {
    mkdir -p "$RUN_DIR" "$CACHE_DIR"
    ensure_postgres
    exec 8>"$CACHE_DIR/.lock"; flock 8
    ensure_venv
    local tmp secrets
    tmp=$(mktemp -d); secrets=$tmp/secrets.env
    write_secrets "$secrets"
    DB_NAME=karios_netbox_seed NETBOX_ROOT=$tmp/root
    write_config "$secrets"
    dropdb -w --if-exists --force "$DB_NAME"
    createdb -w "$DB_NAME"
    log "netbox migrate into $DB_NAME (5-7 min)"
    migrate_db
    [ "$(psql -w -d "$DB_NAME" -Atqc 'SELECT (SELECT count(*) FROM users_user) + (SELECT count(*) FROM users_token)')" = 0 ] \
        || die "the migrated database holds users or tokens: not a seed"
    mkdir -p "$(dirname "$SEED_DUMP")"
    pg_dump -w -Fc -d "$DB_NAME" -f "$SEED_DUMP.tmp"
    mv "$SEED_DUMP.tmp" "$SEED_DUMP"
    dropdb -w --force "$DB_NAME"
    rm -rf "$tmp"
    log "wrote $SEED_DUMP ($(du -h "$SEED_DUMP" | cut -f1)); commit it"
}

build_db_cache() {  # $1 = final cache dir (db-pgNN)
    local dst=$1 tmp=$1.tmp
    rm -rf "$tmp"; mkdir -p "$tmp"
    write_secrets "$tmp/secrets.env"
    write_config "$tmp/secrets.env"
    dropdb -w --if-exists --force "$DB_NAME"
    createdb -w "$DB_NAME"
    if [ -f "$SEED_DUMP" ]; then
        # The repository's migrated schema (no users, no tokens, no secrets): seconds, not a
        # migrate's minutes. It must be this NetBox version's own end state: migrate --check says so.
        log "restoring NetBox $NETBOX_VERSION's migrated schema from ${SEED_DUMP#"$LAB_DIR/"}"
        pg_restore -w --no-owner --no-acl -d "$DB_NAME" "$SEED_DUMP" \
            || die "pg_restore of $SEED_DUMP failed (regenerate it: $0 seed)"
        if ! "$VENV/bin/netbox" migrate --check >"$RUN_DIR/migrate.log" 2>&1; then
            log "the seed lacks some of NetBox $NETBOX_VERSION's migrations: applying them (regenerate it: $0 seed)"
            migrate_db
        fi
    else
        log "netbox migrate (first run only, 5-7 min)"
        migrate_db
    fi
    log "creating superuser admin and a v2 API token"
    KARIOS_TOKEN_FILE="$tmp/token" "$VENV/bin/netbox" shell -c "
import os
from users.models import Token, User
user = User.objects.create_superuser('admin', 'admin@karios.invalid', 'admin')
token = Token(user=user, version=2, write_enabled=True, description='karios contract-test lab')
token.full_clean()
token.save()
with open(os.environ['KARIOS_TOKEN_FILE'], 'w') as f:
    f.write(f'nbt_{token.key}.{token.token}')
" >"$RUN_DIR/bootstrap.log" 2>&1 || { cat "$RUN_DIR/bootstrap.log" >&2; die "creating superuser/token failed"; }
    grep -qE '^nbt_[A-Za-z0-9]{12}\.[A-Za-z0-9]{40}$' "$tmp/token" || die "unexpected token format in $tmp/token"
    pg_dump -w -Fc -d "$DB_NAME" -f "$tmp/netbox.dump"
    chmod 600 "$tmp/token" "$tmp/secrets.env"
    rm -rf "$dst"; mv "$tmp" "$dst"
    log "cached migrated database: $dst/netbox.dump ($(du -h "$dst/netbox.dump" | cut -f1))"
}

# pg_restore of the ~1.2 MB dump takes ~6 s (hundreds of tables and indexes), while CREATE DATABASE
# ... TEMPLATE copies files in ~0.5 s. So the dump is restored once per PostgreSQL cluster into a
# template database named after the dump's hash (connections disallowed, so cloning never finds it
# busy), and every up clones that: same content as restoring the dump, ~10x faster.
psql_admin() { psql -w -d postgres -v ON_ERROR_STOP=1 -Atqc "$1"; }

drop_template() {
    psql_admin "ALTER DATABASE \"$1\" WITH IS_TEMPLATE false ALLOW_CONNECTIONS true" >/dev/null 2>&1 || true
    dropdb -w --if-exists --force "$1"
}

restore_db() {  # $1 = db cache dir
    local tpl old
    tpl=${DB_NAME}_tpl_$(sha256sum "$1/netbox.dump" | cut -c1-12)
    if [ "$(psql_admin "SELECT count(*) FROM pg_database WHERE datname = '$tpl'")" != 1 ]; then
        log "restoring the dump into template database $tpl (once per dump and cluster)"
        for old in $(psql_admin "SELECT datname FROM pg_database WHERE datname LIKE '${DB_NAME}\\_tpl\\_%'"); do
            drop_template "$old"
        done
        createdb -w "$tpl.tmp"
        pg_restore -w --no-owner --no-acl -d "$tpl.tmp" "$1/netbox.dump" \
            || { drop_template "$tpl.tmp"; die "pg_restore of $1/netbox.dump failed (delete $1 to rebuild it)"; }
        psql_admin "ALTER DATABASE \"$tpl.tmp\" RENAME TO \"$tpl\"" >/dev/null
        psql_admin "ALTER DATABASE \"$tpl\" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false" >/dev/null
    fi
    dropdb -w --if-exists --force "$DB_NAME"
    createdb -w -T "$tpl" "$DB_NAME"
    log "$DB_NAME cloned from $tpl"
}

# ---------------------------------------------------------------------------------------------
# Processes

pid_of() {  # $1 = name (runserver|rqworker): prints the pid if it is alive and really ours
    local f=$RUN_DIR/$1.pid pid
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "netbox $1" || return 1
    echo "$pid"
}

# Each process is started as a session leader (setsid), so its pid is also its process-group id:
# stopping the group also stops children such as the rqworker's scheduler process.
session_alive() {  # any non-zombie process left in session $1 (init may reap orphans late)
    ps -o stat= -s "$1" 2>/dev/null | grep -qv '^Z'
}

stop_proc() {
    local pid
    if pid=$(pid_of "$1"); then
        log "stopping $1 (pid $pid)"
        # A second TERM turns RQ's warm shutdown (which can take ~10 s) into a cold one.
        local sig
        for sig in TERM TERM KILL; do
            kill -"$sig" -- "-$pid" 2>/dev/null || kill -"$sig" "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do session_alive "$pid" || break 2; sleep 0.1; done
        done
    fi
    rm -f "$RUN_DIR/$1.pid"
}

start_bg() {  # $1 = name, rest = netbox args; the lock fds are closed so children do not hold them
    local name=$1; shift
    # The inner shell writes its own pid and execs netbox, so the pidfile is right even if setsid forks.
    nohup setsid bash -c 'echo $$ >"$0"; exec "$@"' "$RUN_DIR/$name.pid" "$VENV/bin/netbox" "$@" \
        >"$RUN_DIR/$name.log" 2>&1 </dev/null 8>&- 9>&- &
    for _ in $(seq 1 50); do [ -s "$RUN_DIR/$name.pid" ] && pid_of "$name" >/dev/null && return 0; sleep 0.1; done
    die "$name did not start (log: $RUN_DIR/$name.log)"
}

NETBOX_URL=http://$NETBOX_HOST:$NETBOX_PORT

http_status() {  # prints the HTTP code of GET /api/status/ with the token (000 if nothing answers)
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 --noproxy '*' \
        -H "Authorization: Bearer $(cat "$RUN_DIR/token" 2>/dev/null)" -H 'Accept: application/json' \
        "$NETBOX_URL/api/status/" || true
}

port_busy() { (exec 3<>"/dev/tcp/$NETBOX_HOST/$NETBOX_PORT") 2>/dev/null; }

print_env() {
    printf 'NETBOX_URL=%s\nNETBOX_TOKEN=%s\n' "$NETBOX_URL" "$(cat "$RUN_DIR/token")"
}

is_up() { pid_of runserver >/dev/null && [ "$(http_status)" = 200 ]; }

start_worker() {
    log "starting netbox rqworker (high, default, low)"
    start_bg rqworker rqworker
}

wait_ready() {
    local deadline=$(( $(date +%s) + NETBOX_START_TIMEOUT )) code
    while :; do
        code=$(http_status)
        case "$code" in
            200) return 0 ;;
            401|403) tail -n 20 "$RUN_DIR/runserver.log" >&2
                     die "NetBox rejects the cached token (HTTP $code): delete $DB_CACHE and retry" ;;
        esac
        if ! pid_of runserver >/dev/null; then
            tail -n 40 "$RUN_DIR/runserver.log" >&2; die "runserver exited (log: $RUN_DIR/runserver.log)"
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            tail -n 40 "$RUN_DIR/runserver.log" >&2
            die "NetBox not ready after ${NETBOX_START_TIMEOUT}s (last HTTP code $code, log: $RUN_DIR/runserver.log)"
        fi
        sleep 0.25
    done
}

# ---------------------------------------------------------------------------------------------

cmd_down() {
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/.lock"; flock 9
    stop_proc rqworker
    stop_proc runserver
    rm -f "$RUN_DIR/env"
    log "down"
}

cmd_up() {
    local with_worker=0 fresh=0
    for a in "$@"; do
        case "$a" in
            --with-worker) with_worker=1 ;;
            --fresh) fresh=1 ;;
            *) die "unknown option for up: $a" ;;
        esac
    done
    mkdir -p "$RUN_DIR" "$CACHE_DIR"
    exec 9>"$RUN_DIR/.lock"; flock 9

    if [ "$fresh" = 0 ] && is_up; then
        if [ "$with_worker" = 1 ] && ! pid_of rqworker >/dev/null; then start_worker; fi
        log "already up at $NETBOX_URL"
        print_env; return 0
    fi
    stop_proc rqworker
    stop_proc runserver
    port_busy && die "something else is listening on $NETBOX_HOST:$NETBOX_PORT (set NETBOX_PORT)"

    ensure_postgres
    ensure_redis

    exec 8>"$CACHE_DIR/.lock"; flock 8   # serialise cache building between concurrent runs
    ensure_venv
    DB_CACHE=$CACHE_DIR/db-pg$(pg_major)
    if [ -f "$DB_CACHE/netbox.dump" ] && [ -f "$DB_CACHE/token" ] && [ -f "$DB_CACHE/secrets.env" ]; then
        write_config "$DB_CACHE/secrets.env"
        log "recreating $DB_NAME from $DB_CACHE/netbox.dump"
        restore_db "$DB_CACHE"
    else
        build_db_cache "$DB_CACHE"   # leaves $DB_NAME freshly migrated: equal to the dump
    fi
    flock -u 8; exec 8>&-

    install -m 600 "$DB_CACHE/token" "$RUN_DIR/token"
    # Stale cache entries (custom fields, config revision) and queued jobs must not leak between runs.
    [ "$(redis_cmds "SELECT $REDIS_TASKS_DB" FLUSHDB "SELECT $REDIS_CACHE_DB" FLUSHDB | grep -c '^+OK')" = 4 ] \
        || die "could not flush Redis dbs $REDIS_TASKS_DB/$REDIS_CACHE_DB"

    log "starting netbox runserver $NETBOX_HOST:$NETBOX_PORT"
    start_bg runserver runserver "$NETBOX_HOST:$NETBOX_PORT" --insecure --noreload --skip-checks
    if [ "$with_worker" = 1 ]; then start_worker; fi
    wait_ready
    print_env >"$RUN_DIR/env"
    log "ready at $NETBOX_URL (log: $RUN_DIR/runserver.log)"
    print_env
}

cmd_env() {
    if ! { [ -f "$RUN_DIR/env" ] && pid_of runserver >/dev/null; }; then die "NetBox lab is not up (run: $0 up)"; fi
    cat "$RUN_DIR/env"
}

cmd_status() {
    if is_up; then
        echo "up: $NETBOX_URL (runserver pid $(pid_of runserver)$(pid_of rqworker >/dev/null && echo ", rqworker pid $(pid_of rqworker)"))"
    else
        echo "down"; return 1
    fi
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    python) mkdir -p "$CACHE_DIR"; find_python ;;
    seed) cmd_seed ;;
    *) echo "usage: $0 up [--with-worker] [--fresh] | down | env | status | python | seed" >&2; exit 2 ;;
esac
