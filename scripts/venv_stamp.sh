#!/usr/bin/env bash
# Rebuild a cached venv only when the content of its inputs changed.
#
#   bash scripts/venv_stamp.sh STAMP INPUT... -- COMMAND...
#
# STAMP holds a sha256 over the INPUT files' content (and names), and $STAMP_SALT if set. When it matches, nothing
# runs; otherwise COMMAND runs and, if it succeeds, STAMP is written. Content, not modification
# times: a fresh checkout's files are all newer than a venv restored from CI's cache, so an
# mtime rule (make's) would delete and rebuild every cached venv on every run. A lock
# (the venv directory's name + .lock, beside it, so a build's `rm -rf VENV` leaves it) serialises concurrent callers, e.g. pytest-xdist workers whose fixtures
# each ask make for the same venv: the second one waits, then finds the stamp current.
set -euo pipefail
STAMP=$1
shift
INPUTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do INPUTS+=("$1"); shift; done
[ $# -gt 0 ] || { echo "venv_stamp.sh: missing -- COMMAND" >&2; exit 2; }
shift
mkdir -p "$(dirname "$(dirname "$STAMP")")"
exec 9>"$(dirname "$STAMP").lock"
flock 9
WANT=$({ sha256sum "${INPUTS[@]}"; echo "${STAMP_SALT:-}"; } | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
rm -f "$STAMP"
"$@"
mkdir -p "$(dirname "$STAMP")"  # the command may have recreated the venv directory
echo "$WANT" >"$STAMP"
