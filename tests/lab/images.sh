#!/usr/bin/env bash
# The image method's artifacts (root.tar.zst, vmlinuz, live.img) for the lab, built once and
# cached under ${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/images/<suite>/ (minutes cold, then
# instant). Packages go through the lab's apt-cacher-ng (tests/lab/aptproxy.sh) when it comes up.
#
#   tests/lab/images.sh [SUITE]        build what is missing (default: bookworm); prints the paths
#   tests/lab/images.sh clean [SUITE]  forget the cached artifacts of SUITE
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/images
if [ "${1:-}" = clean ]; then
  rm -rf "${OUT:?}/${2:-bookworm}"
  exit 0
fi
SUITE=${1:-bookworm}
PROXY=""
if [ -x tests/lab/aptproxy.sh ] && env_lines=$(tests/lab/aptproxy.sh up 2>/dev/null); then
  PROXY=$(printf '%s\n' "$env_lines" | sed -n 's/^KARIOS_APT_PROXY=//p' | tr -d "'\"")
fi
mkdir -p "$OUT"
exec uv run python -m karios.provisioner.install.live build --suite "$SUITE" --out "$OUT" ${PROXY:+--proxy "$PROXY"}
