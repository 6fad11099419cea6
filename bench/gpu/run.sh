#!/usr/bin/env bash
# T1's GPU kit: inference, R3 fidelity, a DeepSpeed PPO step and the long-context table on one GPU.
#
#     bench/gpu/run.sh            # on the GPU machine, from the repository root; results under $OUT
#     bench/gpu/run.sh --cpu      # the dry run (tiny shapes, CPU) the tests run
#
# Unpacks the carried wheels (bench/gpu/wheels, made by scripts/gpu_wheels.sh) into a temporary site
# folder put first on PYTHONPATH, then runs bench/gpu/kit.py: each part in its own process under its own
# time limit, JSON and logs under $OUT (default .t1/gpu_out), the summary table last. See bench/gpu/README.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.t1/gpu_out}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
mkdir -p "$OUT/logs"
SITE=$(mktemp -d "${TMPDIR:-/tmp}/t1-gpu-site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
"$PY" bench/gpu/install.py bench/gpu/wheels "$SITE" > "$OUT/logs/install.log" 2>&1 || {
    echo "run.sh: unpacking the wheels failed, see $OUT/logs/install.log" >&2; exit 1; }
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# DeepSpeed's CPU op: where `make setup` built it for this checkout's virtualenv (t1.coordinator.local.children), else
# a folder of the kit's own (the GPU machine). Compiling it inside a part's time limit, and a compile killed there
# leaving its lock behind, made the trainer part hang.
if [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then
    if [ "$PY" = .venv/bin/python ]; then TORCH_EXTENSIONS_DIR=$PWD/.venv/torch_extensions; else TORCH_EXTENSIONS_DIR=$PWD/.t1/torch_ext; fi
fi
export TORCH_EXTENSIONS_DIR
export TOKENIZERS_PARALLELISM=false
exec "$PY" -m bench.gpu.kit --out "$OUT" "$@"
