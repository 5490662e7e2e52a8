#!/usr/bin/env bash
# The SGLang 0.5.23 CPU venv in which the topas plugin's adapter is tested against SGLang's real
# scheduler classes (SchedulePolicy, PrefillAdder, RadixCache / UnifiedRadixCache, Req).
#
#   bash scripts/build_sglang_env.sh [VENV]        (default .venvs/sglang; `make sglang-env`)
#
# SGLang cannot serve on a CPU (its model runner needs CUDA kernels), and a plain
# `pip install sglang` pulls several GB of CUDA packages. So: the CPU torch wheel, sglang with
# --no-deps, the pure-Python import closure pinned in scripts/sglang-0.5.23-cpu.txt (also
# --no-deps, so nothing can pull CUDA torch), inert import stubs for triton and torchvision,
# and this project (editable, so its `sglang.srt.plugins` entry point is registered). ~1.5 GB.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
VENV=${1:-$ROOT/.venvs/sglang}
PYTHON=${PYTHON:-python3.11}
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0+cpu
# PyTorch's CPU builds (`+cpu`) are not on PyPI: they come from PyTorch's own CPU wheel index.
# The first attempt uses pip's configured sources only (a machine that keeps the wheel on disk,
# e.g. through PIP_FIND_LINKS, installs it offline); when they do not hold it (a GitHub runner:
# PyPI answers "no matching distribution" at once) the second asks TORCH_INDEX. Set TORCH_INDEX
# to a mirror if needed.
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"${PIP[@]}" "torch==$TORCH_VERSION" 2>/dev/null \
    || "${PIP[@]}" --extra-index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" --no-deps -r "$HERE/sglang-$SGLANG_VERSION-cpu.txt"
# The project and its own (light) dependencies; torch stays the CPU wheel.
CONS=$(mktemp)
trap 'rm -f "$CONS"' EXIT
printf "torch==%s\npython-dateutil<3\n" "$TORCH_VERSION" >"$CONS"  # sglang pins dateutil<3
"${PIP[@]}" -c "$CONS" -e "$ROOT"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$HERE/sglang_cpu_stubs.py" "$SITE/sglang_cpu_stubs.py"
echo "import sglang_cpu_stubs" >"$SITE/zz_sglang_cpu_stubs.pth"
"$VENV/bin/python" -W ignore -c "
import sglang, sglang.srt.managers.scheduler, sglang.srt.managers.schedule_policy
import sglang.srt.mem_cache.radix_cache, sglang.srt.plugins
import topas_bench.runners.sglang.adapter
assert sglang.__version__ == '$SGLANG_VERSION', sglang.__version__
print('sglang', sglang.__version__, 'CPU venv OK:', '$VENV')
"
