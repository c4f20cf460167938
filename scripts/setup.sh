#!/usr/bin/env bash
# Create .venv (if missing) and install aiocollect into it with the given extras (e.g. dev,jax),
# printing a line for each step and pip's own progress.
#
# torch==2.13.0 goes in first, the version the project is tested with. Pinning it does not make it
# small: on Linux the default index's torch wheel is the CUDA build, several GB with its libraries.
# For the CPU-only build, give PyTorch's CPU index:
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# (by hand: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu). A torch
# 2.13.0 already in .venv, of either build, is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
step() { echo "==> setup: $*"; }
if [ ! -x .venv/bin/python ]; then
    step "creating the virtualenv .venv"
    python3 -m venv .venv
fi
step "upgrading pip in .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    step "installing torch==2.13.0 from $TORCH_INDEX_URL"
    .venv/bin/python -m pip install --disable-pip-version-check "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
else
    step "installing torch==2.13.0 (on Linux the default index's build bundles CUDA, several GB; for the CPU-only" \
         "build: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh)"
    .venv/bin/python -m pip install --disable-pip-version-check "torch==2.13.0"
fi
step "installing aiocollect from this checkout with its dependencies: pip install -e .${extras:+[$extras]}"
.venv/bin/python -m pip install --disable-pip-version-check -e ".${extras:+[$extras]}"
step "done. 'source .venv/bin/activate' puts aiocollect and the venv's python on PATH (or run .venv/bin/aiocollect)"
