#!/usr/bin/env bash
# Set up and run the whole test suite: ruff, mypy, then pytest (tests/README.md says what is where).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,jax,ray
.venv/bin/ruff check .          # the linter, configured in pyproject.toml
.venv/bin/mypy                  # the types of aiocollect/ ([tool.mypy] in pyproject.toml; cached in .mypy_cache/)
# three test processes on the 2-core CI machine: most tests wait on worker processes,
# subprocesses and timeouts part of the time, so a third keeps both cores busy (the contract
# suite: 157 s with two, 146 s with three; the whole suite 10 min 50 s with three); tests that
# start Ray share one process (xdist_group "ray"), so one Ray instance runs at a time
# (-rs: the reason of every skipped test in the summary; tests/gpu/ skips where there is no CUDA;
# --durations: the slowest tests, where the suite's time goes)
.venv/bin/python -m pytest -n 3 --dist loadgroup -rs --durations=25 "$@"
