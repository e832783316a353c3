#!/usr/bin/env bash
# The image method's artifacts (root.tar.zst, vmlinuz, live.img) for the lab, built once and
# cached under ${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/images/<key>/bookworm/, the key a hash
# of what shapes them (tests/fixtures/installs.py: IMAGE_INPUTS) — minutes cold, then
# instant, rebuilt when what shapes the images changes. Packages go through the lab's
# apt-cacher-ng (tests/lab/aptproxy.sh) when it comes up. The VM tests use the same cache.
#
#   tests/lab/images.sh          build what is missing; prints the directory
#   tests/lab/images.sh clean    forget every cached image
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = clean ]; then
  rm -rf "${KARIOS_LAB_CACHE:-/var/cache/karios-lab}/images"
  exit 0
fi
exec uv run python -c 'from tests.fixtures.installs import SUITE, cached_live_images
print(cached_live_images().images_dir / SUITE)'
