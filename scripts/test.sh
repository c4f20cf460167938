#!/usr/bin/env bash
# Set up and run the whole test suite: ruff, then pytest (tests/README.md says what is where).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,jax,ray
.venv/bin/ruff check .          # the linter, configured in pyproject.toml
.venv/bin/python -m pytest "$@"
