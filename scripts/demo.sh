#!/usr/bin/env bash
# Set up and run the main job: collect CartPole-v1 with a progress bar, print frames/s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
.venv/bin/python examples/collect_cartpole.py "$@"
