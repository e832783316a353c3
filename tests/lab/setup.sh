#!/usr/bin/env bash
# Install the Debian packages the lab tests use (a warm machine installs nothing: dpkg is asked first).
# Runs as root (CI); as a normal user it only reports what is missing — those tests then skip.
set -euo pipefail
codename_ver=$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 12)
PKGS=(
  openssh-server frr frr-pythontools iproute2 iputils-ping          # compute nodes (fabric rollout; ping: the dataplane check)
  debconf-utils                                                     # preseed validation
  xorriso isolinux syslinux-common grub-efi-amd64-bin grub-pc-bin    # provisioning boot media
  grub-common mtools dosfstools cpio
  "debian-installer-${codename_ver}-netboot-amd64"
  redis-server                                                      # NetBox lab
  git                                                               # bootapi template sync
  qemu-system-x86 ipxe                                              # real iPXE client (bootapi)
  qemu-utils ovmf socat zstd                                        # installs/wipes booted in a VM
  mawk gawk busybox                                                 # callbacks' JSON under every awk it meets
  btrfs-progs fdisk gdisk                                           # the wipe and whole-disk images on loop devices
  mmdebstrap apt-cacher-ng                                          # image builds, installer proxy
  prometheus                                                        # dashboards/alerts (promtool) against a real Prometheus
  chromium chromium-driver                                          # the web console in a real browser (Selenium)
  wrk                                                               # every_route.py's 100 connections (its script tested)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "lab setup: not root; missing packages (their tests will skip): ${missing[*]}" >&2
  exit 0
fi
echo "lab setup: installing ${missing[*]}" >&2
# policy-rc.d keeps package installs from starting system daemons (sshd, frr, redis) we manage ourselves.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || true
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[ $created_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
exit 0
