#!/usr/bin/env bash
# Set up and run the main job: collect CartPole-v1 in 2 worker processes with a progress bar,
# save the frames as a memory-mapped TensorDict, print frames/s. Each step says what it does;
# TORCH_INDEX_URL is passed on to scripts/setup.sh (the CPU-only torch build: see there).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> demo: setting up .venv (scripts/setup.sh: torch, then aiocollect; a few minutes the first time)"
bash scripts/setup.sh
out="${TMPDIR:-/tmp}/aiocollect-demo"
echo "==> demo: collecting 500,000 frames of CartPole-v1, random actions, 2 workers x 16 envs, into $out"
.venv/bin/aiocollect collect --env CartPole-v1 --workers 2 --envs-per-worker 16 --frames 500000 \
    --out "$out" --overwrite "$@"
echo "==> demo: done. Next: 'source .venv/bin/activate', then the README's first hour (aiocollect is on PATH)"
