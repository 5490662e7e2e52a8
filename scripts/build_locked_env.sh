#!/usr/bin/env bash
# A venv installed exactly from lock files, every one with --no-deps (nothing resolved at
# install time): MetaGPT 0.8.2, MetaGPT main, and sglang-router 0.3.2 (`make metagpt-env`,
# `make metagpt-main-env`, `make router-env`).
#
#   PYTHON=python3.11 MAX_PYTHON=3.12 bash scripts/build_locked_env.sh VENV LOCK [LOCK...]
#
# A lock whose name ends in -recorder.txt carries hashes and is installed with --require-hashes.
# MAX_PYTHON (optional) refuses an interpreter at or above that version, with the reason.
set -euo pipefail
VENV=$1
shift
PYTHON=${PYTHON:-python3}
if [ -n "${MAX_PYTHON:-}" ]; then
    "$PYTHON" -c "import sys; v = tuple(map(int, '$MAX_PYTHON'.split('.'))); sys.exit(sys.version_info[:2] >= v and f'$VENV needs Python < $MAX_PYTHON (its pins); set the interpreter with PYTHON=...')"
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
for LOCK in "$@"; do
    HASHES=()
    case "$LOCK" in *-recorder.txt) HASHES=(--require-hashes) ;; esac
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "${HASHES[@]}" -r "$LOCK"
done
