#!/usr/bin/env bash
# Checks that MetaGPT main's TeamLeader roles import in a venv (make metagpt-main-env):
#   scripts/check_metagpt_main.sh VENV SRC
# MetaGPT reads its config when the roles are imported: a throwaway one is written to a temp dir.
set -euo pipefail
venv=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/config"
printf 'llm:\n  api_type: "open_llm"\n  base_url: "http://127.0.0.1:9/v1"\n  api_key: "sk-none"\n  model: "none"\n' \
  >"$tmp/config/config2.yaml"
cd "$tmp"
if ! METAGPT_PROJECT_ROOT="$tmp" HOME="$tmp" "$venv/bin/python" - "$src" >"$tmp/log" 2>&1 <<'PY'
import sys

sys.path.insert(0, sys.argv[1])
import pandas  # noqa: F401  (before MetaGPT, which stubs pyarrow)
import metagpt.provider  # noqa: F401
from metagpt.environment.mgx.mgx_env import MGXEnv  # noqa: F401
from metagpt.roles import Architect, ProductManager, ProjectManager  # noqa: F401
from metagpt.roles.di.engineer2 import Engineer2  # noqa: F401
from metagpt.roles.di.team_leader import TeamLeader  # noqa: F401
PY
then
  tail -5 "$tmp/log" >&2
  echo "MetaGPT main in $src does not import in $venv" >&2
  exit 1
fi
echo "MetaGPT main in $src imports in $venv"
