#!/usr/bin/env bash
# Set up and run the main job: collect CartPole-v1 in 2 worker processes with a progress bar,
# save the frames as a memory-mapped TensorDict, print frames/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="${TMPDIR:-/tmp}/aiocollect-demo"
.venv/bin/aiocollect collect --env CartPole-v1 --workers 2 --envs-per-worker 16 --frames 500000 \
    --out "$out" --overwrite "$@"
