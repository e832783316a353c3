#!/usr/bin/env bash
# Run the whole Karios system on this machine (embedded NATS + PostgreSQL unless KARIOS_NATS_URL /
# KARIOS_DATABASE_URL point elsewhere; file-backed inventory unless KARIOS_NETBOX_URL is set).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap-uv.sh
uv sync --locked --all-packages --quiet --compile-bytecode
# Our own packages are editable installs: compile them too (some machines set PYTHONDONTWRITEBYTECODE).
uv run --locked python -m compileall -q libs services cli >/dev/null
exec uv run --locked karios up "$@"
