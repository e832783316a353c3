#!/usr/bin/env bash
# Make `uv` available (installs it from PyPI with pip when missing). Sourced by the other scripts.
if ! command -v uv >/dev/null 2>&1; then
  if [ -x "$HOME/.local/bin/uv" ]; then
    export PATH="$HOME/.local/bin:$PATH"
  else
    echo "bootstrap: installing uv from PyPI" >&2
    python3 -m pip install --user --quiet uv 2>/dev/null \
      || python3 -m pip install --user --quiet --break-system-packages uv
    export PATH="$HOME/.local/bin:$PATH"
  fi
fi
