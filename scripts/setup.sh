#!/usr/bin/env bash
# Set up everything T1 needs on a fresh Debian/Ubuntu machine: system packages and the .venv.
# Idempotent: a second run only checks. Used by `make run`, `make test` and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${T1_VENV:-.venv}
PYTHON=${PYTHON:-python3}
# chromium + chromium-driver: the headless browser the viewer's tests drive (tests/view).
SYSTEM_PACKAGES=(openssh-server openssh-client bubblewrap slirp4netns g++ tmux openssl git chromium chromium-driver)
STAMP="$VENV/.t1-setup-$(sha256sum pyproject.toml | cut -c1-16)"

missing=()
for cmd in /usr/sbin/sshd bwrap slirp4netns g++ tmux openssl git chromium chromedriver; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if ((${#missing[@]})); then
  echo "t1 setup: installing system packages (missing: ${missing[*]})"
  if [[ $(id -u) -ne 0 ]]; then
    echo "t1 setup: need root to apt-get install ${SYSTEM_PACKAGES[*]}; run as root or install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${SYSTEM_PACKAGES[@]}" >/dev/null
fi

# The docker provider's tests (tests/docker) start a private dockerd: T1_SETUP_DOCKER=1 (or `make
# setup-docker`) installs it; .ci/run sets it, so CI runs those tests.
if [[ ${T1_SETUP_DOCKER:-0} == 1 ]] && ! command -v dockerd >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "t1 setup: need root to apt-get install docker.io (T1_SETUP_DOCKER=1)" >&2
    exit 1
  fi
  echo "t1 setup: installing docker.io (T1_SETUP_DOCKER=1)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi

# The agent harnesses T1 runs unmodified inside sandboxes (rollout.harness; idempotent): T1_SETUP_HARNESSES=0 skips.
if [[ ${T1_SETUP_HARNESSES:-1} == 1 ]]; then
  bash scripts/harnesses.sh
fi

if [[ -f "$STAMP" ]]; then
  exit 0
fi

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    raise SystemExit(f"t1 setup: Python >= 3.11 required, found {sys.version.split()[0]}")
PY
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
echo "t1 setup: installing Python packages into $VENV"
"${PIP[@]}" install -q -U pip setuptools wheel
# The CPU build of torch first, so nothing later pulls a CUDA build.
"${PIP[@]}" install -q "torch==2.13.0"
# DeepSpeed's setup imports torch: build it against the torch just installed.
"${PIP[@]}" install -q --no-build-isolation "deepspeed>=0.19,<0.20"
"${PIP[@]}" install -q --no-build-isolation -e ".[dev]"
# DeepSpeed's CPU communication op, compiled with g++ on first use: built here, into the folder the trainer
# looks in (t1.coordinator.local.children.torch_extensions_dir), so the first run does not spend a minute on it.
echo "t1 setup: building DeepSpeed's CPU op"
TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(cd "$VENV" && pwd)/torch_extensions} "$VENV/bin/python" -c '
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)' >/dev/null
rm -f "$VENV"/.t1-setup-*
touch "$STAMP"
echo "t1 setup: done"
