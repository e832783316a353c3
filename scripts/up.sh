#!/usr/bin/env bash
# Run the whole Karios system on this machine (embedded NATS + PostgreSQL unless KARIOS_NATS_URL /
# KARIOS_DATABASE_URL point elsewhere; file-backed inventory unless KARIOS_NETBOX_URL is set).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-uv.sh
uv sync --locked --all-packages --quiet
exec uv run --locked karios up "$@"
