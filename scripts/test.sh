#!/usr/bin/env bash
# Set up and run the whole test suite: ruff, mypy, then pytest (tests/README.md says what is where).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,jax,ray
.venv/bin/ruff check .          # the linter, configured in pyproject.toml
.venv/bin/mypy                  # the types of aiocollect/ ([tool.mypy] in pyproject.toml; cached in .mypy_cache/)
# two test processes: most tests wait on worker processes and subprocesses, and the 2-core CI
# machine finishes in about two thirds of the time; tests that start Ray share one process
# (xdist_group "ray"), so one Ray instance runs at a time
# (-rs: the reason of every skipped test in the summary; tests/gpu/ skips where there is no CUDA;
# --durations: the slowest tests, where the suite's time goes)
.venv/bin/python -m pytest -n 2 --dist loadgroup -rs --durations=25 "$@"
