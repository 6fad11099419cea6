#!/usr/bin/env bash
# Harbor as the reference reader of task folders: Harbor 0.25 (Python >= 3.12) in a virtual environment of its
# own, then the tests that read every vendored Harbor task with Harbor's task model and with T1's loader.
#   tests/tasks/harbor_reference/run.sh        # from the repository root; VENV=... PYTHON=... to choose
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV=${VENV:-.t1/venv-harbor}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3.12 python3.13 "$HOME/.pyenv/versions/3.12.1/bin/python" "$HOME/.pyenv/versions/3.13.0/bin/python"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      PY=$candidate; break
    fi
  done
fi
[ -n "$PY" ] || { echo "harbor reference: no Python >= 3.12 found (set PYTHON)" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import harbor.models.task.task" 2>/dev/null; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "harbor==0.25.0"
fi
export T1_HARBOR_PYTHON="$(cd "$VENV" && pwd)/bin/python"
exec .venv/bin/python -m pytest -m harbor_reference tests/tasks/harbor_reference -p no:cacheprovider -q "$@"
