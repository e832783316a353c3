#!/bin/sh
# Karios installer callbacks for job job-1. The token authorizes this job only.
# Runs under d-i's busybox sh. Every callback goes through an ordered on-disk queue: it is sent once
# the network is up, retried with backoff for up to RETRY_FOR seconds, and never dropped silently
# (every retry, refusal and give-up is logged to the installer syslog with tag "karios").
URL='http://10.0.0.1:8080/controlnode'
JOB='job-1'
TOKEN='tok-abc'
SPOOL=${KARIOS_SPOOL:-/var/spool/karios}  # overridable for tests, like the paths below
SYSLOG=${KARIOS_SYSLOG:-/var/log/syslog}
HERE=${KARIOS_DIR:-/karios}
RETRY_FOR=300
# Where a failed install powers the server off (like the image path): the kernel's sysrq trigger,
# only inside the installer (its /lib/debian-installer.d); tests point KARIOS_SYSRQ at a file.
SYSRQ=${KARIOS_SYSRQ:-}
[ -n "$SYSRQ" ] || { [ -d /lib/debian-installer.d ] && SYSRQ=/proc/sysrq-trigger; }
# The stages, in order, as "key:percent:state" (state sent with the step).
STAGES='network:52:done mirror:56:done partitioning:60:active base-system:68:active packages:76:active bootloader:84:active late-command:88:active'

log() { logger -t karios "$*" 2>/dev/null || echo "karios: $*" >&2; }
now() { date +%s; }
has_net() { [ -n "$(os_ip)" ]; }
os_ip() {
  ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n 1
}

# POST one callback; the server's answer on stderr. Never through the mirror proxy.
post() {
  (
    unset http_proxy https_proxy HTTP_PROXY
    wget -q -O /dev/null -T 10 --header "Content-Type: application/json" \
      --header "X-Karios-Job-Token: $TOKEN" --post-data "$2" "$URL$1"
  )
}

# Append one callback (PATH, JSON) to the queue; files are named by a sequence number.
enqueue() {
  local tries n f
  mkdir -p "$SPOOL/q" "$SPOOL/failed"
  tries=0
  while ! mkdir "$SPOOL/qlock" 2>/dev/null && [ $tries -lt 10 ]; do sleep 1; tries=$((tries + 1)); done
  n=$(($(cat "$SPOOL/seq" 2>/dev/null || echo 0) + 1))
  echo "$n" >"$SPOOL/seq"
  rmdir "$SPOOL/qlock" 2>/dev/null
  f=$(printf '%06d' "$n")
  printf '%s\n%s\n' "$1" "$2" >"$SPOOL/.$f" && mv "$SPOOL/.$f" "$SPOOL/q/$f"
}

# Flush in a background process of its own ($$ in a subshell would be the parent's pid, and the
# lock holder's pid must be its own). It closes every descriptor: d-i waits for the pipes of
# early/late_command to close.
kick_bg() { (sh "$HERE/cb.sh" kick </dev/null >/dev/null 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &); }

# Send one queued file: retry with backoff (1, 2, 4 … 30 s) until RETRY_FOR has passed.
send_file() {
  local path body start delay out
  [ -f "$1" ] || return 0
  path=$(head -n 1 "$1")
  body=$(tail -n +2 "$1")
  start=$(now)
  delay=1
  until out=$(post "$path" "$body" 2>&1); do
    case "$out" in
      *"returned error: HTTP/1."?" 4"*)
        log "callback $path refused, not retried: $out"
        mv "$1" "$SPOOL/failed/" && return 0
        ;;
    esac
    if [ $(($(now) - start)) -ge "$RETRY_FOR" ]; then
      log "callback $path not delivered after ${RETRY_FOR}s, giving up: $out"
      mv "$1" "$SPOOL/failed/" && return 0
    fi
    log "callback $path failed (${out:-no answer}); retrying in ${delay}s"
    sleep "$delay"
    delay=$((delay * 2))
    [ "$delay" -gt 30 ] && delay=30
  done
  log "callback $path delivered"
  rm -f "$1"
}

# Flush the queue in order. One flusher at a time (mkdir is atomic); a caller that finds the lock
# taken leaves its file to the holder, which re-checks the queue after unlocking.
kick() {
  local holder f waited
  while [ -n "$(ls "$SPOOL/q" 2>/dev/null)" ]; do
    if ! mkdir "$SPOOL/lock" 2>/dev/null; then
      holder=$(cat "$SPOOL/lock/pid" 2>/dev/null)
      if [ -n "$holder" ] && ! kill -0 "$holder" 2>/dev/null; then
        rm -rf "$SPOOL/lock"
        continue
      fi
      return 0
    fi
    echo $$ >"$SPOOL/lock/pid"
    waited=0
    while ! has_net && [ "$waited" -lt "$RETRY_FOR" ]; do sleep 2; waited=$((waited + 2)); done
    if ! has_net; then
      log "no network after ${RETRY_FOR}s; $(ls "$SPOOL/q" | wc -l) callbacks stay queued in $SPOOL/q"
      rm -rf "$SPOOL/lock"
      return 1
    fi
    for f in $(ls "$SPOOL/q"); do
      send_file "$SPOOL/q/$f"
    done
    rm -rf "$SPOOL/lock"
  done
}

# Wait (bounded) until everything queued so far has been delivered or given up.
drain() {
  local deadline
  deadline=$(($(now) + RETRY_FOR + 30))
  while [ -n "$(ls "$SPOOL/q" 2>/dev/null)" ] && [ "$(now)" -lt "$deadline" ]; do
    kick
    sleep 1
  done
}

# JSON string escaping of stdin, one line: ASCII only (anything else becomes "?", so a cut can
# never split a UTF-8 sequence), control characters as spaces, backslash and quote escaped.
json_str() {
  tr '\n' ' ' | LC_ALL=C sed -e 's/[[:cntrl:]]/ /g' -e 's/[^ -~]/?/g' -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/ *$//'
}

step() {  # KEY STATE [PERCENT]
  enqueue "/job/$JOB/step" "{\"step\": \"$1\", \"state\": \"$2\", \"percent\": ${3:-0}}"
  kick_bg
}

# A stage by key: sends it (with its percent and state from STAGES) and any earlier stage not sent
# yet, each once and in order, whoever calls (the reporter, late_command). $SPOOL/stage holds the
# number of stages sent so far.
stage() {
  local idx i s last rest tries
  idx=0
  i=0
  for s in $STAGES; do
    i=$((i + 1))
    [ "${s%%:*}" = "$1" ] && idx=$i
  done
  [ "$idx" -gt 0 ] || { log "unknown stage $1"; return 0; }
  mkdir -p "$SPOOL"
  tries=0  # one reporter of stages at a time (the reporter, partman/early_command, late_command)
  while ! mkdir "$SPOOL/slock" 2>/dev/null && [ $tries -lt 10 ]; do sleep 1; tries=$((tries + 1)); done
  last=$(cat "$SPOOL/stage" 2>/dev/null || echo 0)
  i=0
  for s in $STAGES; do
    i=$((i + 1))
    [ "$i" -le "$last" ] && continue
    [ "$i" -gt "$idx" ] && break
    rest=${s#*:}
    enqueue "/job/$JOB/step" "{\"step\": \"${s%%:*}\", \"state\": \"${rest#*:}\", \"percent\": ${rest%%:*}}"
    echo "$i" >"$SPOOL/stage"
  done
  rmdir "$SPOOL/slock" 2>/dev/null
  kick_bg
}

# failed MESSAGE STEP: the installer's own message and the last 30 lines of its log.
failed() {
  local msg lines
  msg=$(printf '%s' "$1" | tr '\n' ' ' | cut -c 1-500 | json_str)  # cut before escaping: valid JSON
  lines=$(grep -v -e ' debconf: ' -e ' karios: ' -e ': *$' "$SYSLOG" 2>/dev/null | tail -n 30 |
    sed -e 's/\$[0-9a-z]\{1,2\}\$[^ ]*/[hash]/g' | while IFS= read -r l; do
      printf '%s' "$l" | cut -c 1-300 | json_str | sed -e 's/^/"/' -e 's/$/",/'
    done | tr -d '\n' | sed 's/,$//')
  log "installer failed at ${2:-install}: $1"
  enqueue "/job/$JOB/step" "{\"step\": \"${2:-install}\", \"state\": \"failed\", \"message\": \"$msg\", \"log\": [$lines]}"
}

configure_target() {
  [ -d /target ] || return 0
  cp "$HERE"/karios-firstboot.sh /target/usr/local/sbin/karios-firstboot
  chmod 0700 /target/usr/local/sbin/karios-firstboot
  cp "$HERE"/karios-firstboot.service /target/etc/systemd/system/karios-firstboot.service
  in-target systemctl enable karios-firstboot.service || log "could not enable karios-firstboot"

  # The SSH public keys the request asked for, for the OS user (validated: one key per line).
  mkdir -p /target/home/debian/.ssh
  cat >/target/home/debian/.ssh/authorized_keys <<'KEYS'
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheGoldenFileOnly0000000000000 ops@example
KEYS
  chmod 0700 /target/home/debian/.ssh
  chmod 0600 /target/home/debian/.ssh/authorized_keys
  in-target chown -R debian: /home/debian/.ssh || log "could not chown the SSH keys"


  # GRUB on the serial console too (the kernel line already has console=… via add-kernel-opts).
  cat >>/target/etc/default/grub <<'EOF'
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --unit=1 --speed=57600"
EOF
  in-target update-grub || log "update-grub failed"

}

case "$1" in
  start-reporter)
    # Started by preseed/early_command, before the network exists: detach and return at once.
    (sh "$HERE/reporter.sh" </dev/null >/dev/null 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &)
    ;;
  step)
    step "$2" "$3" "${4:-0}"
    ;;
  stage)
    stage "$2"
    ;;
  failed)
    failed "$2" "${3:-install}"
    drain
    # The report is out (or given up after RETRY_FOR): power off rather than sit at the question.
    log "install failed: powering off"
    sync
    [ -z "$SYSRQ" ] || echo o >"$SYSRQ"
    ;;
  late-command)
    stage late-command
    configure_target
    ;;
  complete)
    enqueue "/job/$JOB/complete" "{\"os_ip\": \"$(os_ip)\"}"
    drain
    ;;
  install-firstboot)
    configure_target
    ;;
  kick)
    kick
    ;;
  flush)
    drain
    ;;
  *)
    echo "usage: cb.sh start-reporter | stage KEY | step NAME STATE PERCENT | failed MESSAGE [STEP] | late-command | complete | install-firstboot | flush" >&2
    exit 2
    ;;
esac
