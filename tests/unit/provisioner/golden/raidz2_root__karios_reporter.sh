#!/bin/sh
# Karios installer reporter (job job-1), started in the background by preseed/early_command.
# (a) waits for the network (the DHCP lease comes ~40 s after early_command) and reports "network";
# (b) follows the installer's syslog and reports each stage once, in order, as main-menu runs it;
# (c) when the installer shows a question the preseed did not answer (at priority critical that is
#     an error or a stop: "Bad archive mirror", a component that cannot be downloaded, no disk …),
#     reports "failed" with the installer's own words and the log tail, then exits.
# Questions are seen through cdebconf's protocol log in the syslog (DEBCONF_DEBUG=developer, set by
# /lib/debian-installer.d/S69karios-debconf-debug from the same overlay), as seen booting bookworm's d-i:
#   debconf: --> INPUT critical retriever/net/error
#   debconf: <-- 0 question will be asked        (or "<-- 30 question skipped" when preseeded)
#   debconf: --> GO                              (the installer now waits for a human)
set -f  # no globbing: log lines are split into words
CB=${KARIOS_DIR:-/karios}/cb.sh
LOG=${KARIOS_SYSLOG:-/var/log/syslog}
TEMPLATES=/var/lib/cdebconf/templates.dat

os_ip() { ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | head -n 1; }

# The stage a main-menu item belongs to (d-i component names).
stage_of() {
  case "$1" in
    netcfg*|ethdetect) echo network ;;
    choose-mirror*|download-installer) echo mirror ;;
    partman*|disk-detect) echo partitioning ;;
    bootstrap-base|base-installer) echo base-system ;;
    apt-setup*|apt-mirror-setup|pkgsel|tasksel) echo packages ;;
    grub-installer|lilo-installer|nobootloader) echo bootloader ;;
    finish-install) echo late-command ;;
  esac
}

# A debconf template's Description (FIELD=Description) or Extended_description, from cdebconf's file.
describe() {
  awk -v name="$1" -v field="$2" '
    /^Name: / { hit = ($2 == name); next }
    hit && index($0, field ": ") == 1 { print substr($0, length(field) + 3); exit }
  ' "$TEMPLATES" 2>/dev/null | sed 's/\\n/ /g'
}

# The installer's last complaints since main-menu started the current component (wget, retriever,
# component errors), without the syslog prefix, "; "-separated.
cause() {
  grep -v -e ' debconf: ' -e ' karios: ' "$LOG" 2>/dev/null |
    awk "/Menu item '.*' selected/ { n = 0; next } { line[n++] = \$0 } END { for (i = 0; i < n; i++) print line[i] }" |
    grep -i -e 'error' -e 'fail' -e 'warning' -e "can't" -e 'cannot' -e 'not found' -e 'unable' \
      -e 'refused' -e 'timed out' -e 'retrieving ' -e 'does not' | tail -n 3 |
    sed -e 's/^[A-Z][a-z][a-z] [ 0-9][0-9] [0-9:]\{8\} //' -e 's/^[^ ]*\]: //' -e 's/^[a-z-]*: //' \
      -e 's/^[0-9-]\{10\} [0-9:]\{8\} //' -e 's/^DEBUG: //' -e 's/^INFO: //' -e 's/^WARNING \*\*: //' -e 's/ *$//' |
    tr '\n' ';' | sed -e 's/;$//' -e 's/;/; /g'
}

while [ -z "$(os_ip)" ]; do sleep 2; done
sh "$CB" stage network

current=network
pending=""
asked=""
tail -n +1 -f "$LOG" 2>/dev/null | while IFS= read -r line; do
  case "$line" in
    *"main-menu"*"Menu item '"*"' selected"*)
      item=${line#*Menu item \'}
      item=${item%%\'*}
      st=$(stage_of "$item")
      if [ -n "$st" ]; then
        # Leaving choose-mirror for the next item means the mirror answered.
        [ "$current" = mirror ] && [ "$st" != mirror ] && sh "$CB" stage mirror
        [ "$item" = download-installer ] && sh "$CB" stage mirror
        [ "$st" != mirror ] && [ "$st" != network ] && sh "$CB" stage "$st"
        current=$st
      fi
      ;;
    *" debconf: --> INPUT "*)
      set -- ${line##*--> INPUT }
      pending=$2
      ;;
    *" debconf: <-- 30 "*)
      pending=""
      ;;
    *" debconf: <-- 0 question will be asked"*)
      [ -n "$pending" ] && asked=$pending
      pending=""
      ;;
    *" debconf: --> GO"*)
      if [ -n "$asked" ]; then
        title=$(describe "$asked" Description | sed 's/ *:* *$//')
        more=$(describe "$asked" Extended_description)
        why=$(cause)
        sh "$CB" failed "${title:-$asked}${why:+: $why} ($asked${more:+: $more})" "$current"
        exit 0
      fi
      ;;
  esac
done
