#!/usr/bin/env bash
# Wheels for bench/gpu/run.sh: what T1's GPU benchmarks import that the GPU machine lacks.
#
# That machine has Python 3.12 with torch, transformers (and its own dependencies: numpy, PyYAML,
# tokenizers, safetensors, huggingface-hub), triton, grpcio, msgpack, uvloop and tensorboard, and no
# network. This script puts the rest into bench/gpu/wheels/ (ignored by git; a device run names it in
# its carry list): DeepSpeed (built here as a pure-Python wheel, ops compiled on first use, none of
# which the benchmarks need: torch AdamW), pydantic and what T1's config and metrics import, protobuf 7
# (T1's generated code needs that runtime), grpcio at least the version T1's generated stubs were made
# with (they refuse an older runtime), asyncssh for T1's sandbox imports. Versions are this
# virtualenv's, so the GPU runs the code the tests ran. Binary wheels are fetched for CPython 3.12
# on manylinux x86_64 through pip's configured index. The total is checked against a budget that
# leaves room for the working tree in the 64 MiB a device call carries.
#
#     scripts/gpu_wheels.sh            # then: run(command="bench/gpu/run.sh", carry=["bench/gpu/wheels"])
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=${DEST:-bench/gpu/wheels}
BUDGET_MIB=${BUDGET_MIB:-40}
PURE=(deepspeed einops hjson py-cpuinfo pydantic annotated-types typing-inspection typing-extensions
      prometheus-client jinja2 grpcio-health-checking grpcio-reflection asyncssh pycparser)
BINARY=(pydantic-core psutil markupsafe cryptography cffi protobuf grpcio)

pin() {  # name==version as installed in this virtualenv
    "$PY" -c 'import importlib.metadata as m, sys; print(f"{sys.argv[1]}=={m.version(sys.argv[1])}")' "$1"
}

rm -rf "$DEST"
mkdir -p "$DEST"
pure=(); for p in "${PURE[@]}"; do pure+=("$(pin "$p")"); done
binary=(); for p in "${BINARY[@]}"; do binary+=("$(pin "$p")"); done
DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" "${pure[@]}"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    -d "$DEST" "${binary[@]}"
count=$(ls "$DEST"/*.whl | wc -l)
expected=$(( ${#PURE[@]} + ${#BINARY[@]} ))
if [ "$count" -ne "$expected" ]; then
    echo "gpu_wheels: $count wheels in $DEST, expected $expected" >&2; exit 1
fi
mib=$(du -sm "$DEST" | cut -f1)
ls -l "$DEST"
echo "gpu_wheels: $count wheels, ${mib} MiB in $DEST (budget ${BUDGET_MIB} MiB)"
if [ "$mib" -gt "$BUDGET_MIB" ]; then
    echo "gpu_wheels: over the budget: the working tree and the wheels must fit 64 MiB" >&2; exit 1
fi
