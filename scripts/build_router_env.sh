#!/usr/bin/env bash
# sglang-router 0.3.2 in its own venv, exactly from requirements/sglang-router-0.3.2.txt
# (`make router-env`), then a check that the router's launcher imports at that version.
#
#   PYTHON=python3 bash scripts/build_router_env.sh [VENV]     (default .venvs/sglang-router)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-$(dirname "$HERE")/.venvs/sglang-router}
bash "$HERE/build_locked_env.sh" "$VENV" "$(dirname "$HERE")/requirements/sglang-router-0.3.2.txt"
"$VENV/bin/python" -c "
import importlib.metadata as m, sglang_router.launch_router
v = m.version('sglang-router')
assert v == '0.3.2', v
print('sglang-router', v, 'in $VENV')
"
