#!/bin/sh
# Karios disk wipe (job job-1): clear signatures and the first/last MiB of each disk.
set -u
DISKS='/dev/sda /dev/nvme0n1'
for d in $DISKS; do
  [ -b "$d" ] || continue
  sh /karios/cb.sh step "wipe:$d" active 60
  wipefs -a "$d" 2>/dev/null || true
  dd if=/dev/zero of="$d" bs=1M count=1 conv=fsync 2>/dev/null || true
  size=$(blockdev --getsz "$d" 2>/dev/null || echo 0)
  if [ "$size" -gt 2048 ]; then
    dd if=/dev/zero of="$d" bs=512 seek=$((size - 2048)) count=2048 conv=fsync 2>/dev/null || true
  fi
done
sh /karios/cb.sh step wiped done 88
