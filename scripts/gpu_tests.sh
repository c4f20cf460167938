#!/usr/bin/env bash
# The GPU tests (tests/gpu/) and the GPU benchmarks on a CUDA machine that has torch, JAX,
# anyio, uvloop, cloudpickle, tqdm and pytest but not the rest (the `device` machine of the
# developers' workplace; tests/README.md says how it is used). Each step fits one device call
# (10 minutes at most); logs go to $OUT (or gpu-out/).
#
#   bash scripts/gpu_tests.sh wheels        # here, with a network: the missing wheels into .whl/
#   bash scripts/gpu_tests.sh run [ARGS]    # there: the GPU tests (tests/gpu, or pytest ARGS), ~7 min
#   bash scripts/gpu_tests.sh bench-gpu     # there: benchmarks/bench_gpu.py (G, J, C, U), ~7 min
#   bash scripts/gpu_tests.sh bench-engine  # there: bench_engine.py --workers 2 8 15 with PufferLib
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
wheels)
    # Python 3.12 on x86-64 manylinux, no dependencies resolved: exactly what the machine lacks
    rm -rf .whl && mkdir -p .whl
    for spec in tensordict==0.14.3 torchrl==0.14.1 gymnasium==1.4.0 pytest-asyncio==1.5.0 pytest-timeout==2.4.0 \
                pyvers==0.2.3 hoptorch orjson importlib_metadata farama-notifications typing_extensions \
                "pufferlib-core==3.0.23" nvidia-ml-py; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
            --platform any -d .whl "$spec"
    done
    du -sh .whl
    ;;
run|bench-gpu|bench-engine)
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the GPU
    nvidia-smi -L | tee "$out/gpu.txt"
    python3 -c "import torch, jax; print('torch', torch.__version__, torch.cuda.is_available(), '| jax', jax.__version__, jax.devices())" \
        | tee -a "$out/gpu.txt"
    case "$1" in
    run)
        # pytest-timeout (carried) fails a hung test after 120 s with its stack; `timeout` keeps
        # the call inside the device's 10 minutes, so the log still comes back
        # `run ARGS...` passes ARGS to pytest in place of tests/gpu: a part of the suite per call
        # (`run tests/gpu/test_cuda_graphs.py`, `run tests/gpu --ignore tests/gpu/test_cuda_graphs.py`)
        shift
        timeout 570 python3 -m pytest -p no:cacheprovider -rs -q --durations=15 -o faulthandler_timeout=150 \
            "${@:-tests/gpu}" 2>&1 | tee "$out/gpu_tests.log"
        exit "${PIPESTATUS[0]}"
        ;;
    bench-gpu)
        (cd benchmarks && python3 bench_gpu.py --repeats 2 --json "$out/gpu.json") 2>&1 | tee "$out/bench_gpu.log"
        ;;
    bench-engine)
        (cd benchmarks && python3 bench_engine.py --workers 2 8 15 --repeats 2 --json "$out/engine.json") 2>&1 \
            | tee "$out/engine.log"
        ;;
    esac
    ;;
*)
    echo "usage: bash scripts/gpu_tests.sh wheels|run|bench-gpu|bench-engine" >&2
    exit 2
    ;;
esac
