#!/bin/sh
# Karios installer callbacks for job job-1. The token authorizes this job only.
URL='http://10.0.0.1:8080/controlnode'
JOB='job-1'
TOKEN='tok-abc'
post() {
  wget -q -O /dev/null -T 10 --header "Content-Type: application/json" \
    --header "X-Karios-Job-Token: $TOKEN" --post-data "$2" "$URL$1" || true
}
os_ip() {
  ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n 1
}
case "$1" in
  step)
    post "/job/$JOB/step" "{\"step\": \"$2\", \"state\": \"$3\", \"percent\": ${4:-0}}"
    ;;
  complete)
    post "/job/$JOB/complete" "{\"os_ip\": \"$(os_ip)\"}"
    ;;
  install-firstboot)
    if [ -d /target ]; then
      cp /karios/karios-firstboot.sh /target/usr/local/sbin/karios-firstboot
      chmod 0700 /target/usr/local/sbin/karios-firstboot
      cp /karios/karios-firstboot.service /target/etc/systemd/system/karios-firstboot.service
      in-target systemctl enable karios-firstboot.service || true
    fi
    ;;
  *)
    echo "usage: cb.sh step NAME STATE PERCENT | complete | install-firstboot" >&2
    exit 2
    ;;
esac
