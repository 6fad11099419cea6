#!/usr/bin/env bash
# Install the agent harnesses T1 runs unmodified inside sandboxes (rollout.harness, docs/harness.md), each
# in a virtualenv of its own under T1_HARNESS_DIR (default /opt/t1-harnesses): a system dir, so every
# local sandbox sees it through its copy-on-write root (the host's /work or /root are hidden there).
#   mini-swe-agent  on the system's python3 (3.11)
#   aider           (aider-chat) on the system's python3 (3.11)
#   harbor          (Terminus-2) on Python 3.12: pyenv's, copied under T1_HARNESS_DIR so sandboxes can run it,
#                   with T1's driver for running Terminus-2 in the sandbox (harbor/t1_terminus2.py)
# Idempotent: a harness whose stamp matches its pinned version is skipped. Used by scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${T1_HARNESS_DIR:-/opt/t1-harnesses}
MINI_SWE_AGENT=2.4.6
HARBOR=0.25.0
AIDER=0.86.2
mkdir -p "$DIR"
chmod 755 "$DIR"

install_harness() {  # name, python, pip spec
  local name=$1 python=$2 spec=$3 venv="$DIR/$1"
  if [[ -f "$venv/.t1-stamp" && $(cat "$venv/.t1-stamp") == "$spec" ]]; then
    return 0
  fi
  echo "t1 harnesses: installing $spec into $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip --disable-pip-version-check install -q "$spec"
  echo "$spec" > "$venv/.t1-stamp"
  chmod -R a+rX "$venv"
}

install_harness mini-swe-agent /usr/bin/python3 "mini-swe-agent==$MINI_SWE_AGENT"
if [[ ${T1_HARNESS_AIDER:-1} == 1 ]]; then
  install_harness aider /usr/bin/python3 "aider-chat==$AIDER"
fi

if [[ ${T1_HARNESS_HARBOR:-1} == 1 ]]; then
  py312="$DIR/python3.12"
  if [[ ! -x "$py312/bin/python3.12" ]]; then
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    src=$(ls -d "$root"/versions/3.12.* 2>/dev/null | sort -V | tail -1 || true)
    if [[ -z $src ]]; then
      echo "t1 harnesses: harbor needs Python >= 3.12 (pyenv install 3.12); skipped" >&2
      exit 0
    fi
    echo "t1 harnesses: copying $src to $py312 (sandboxes cannot see $root)"
    cp -a "$src" "$py312.tmp"
    chmod -R a+rX "$py312.tmp"
    mv "$py312.tmp" "$py312"
  fi
  install_harness harbor "$py312/bin/python3.12" "harbor==$HARBOR"
  # T1's driver that runs Harbor's Terminus-2 inside the sandbox it works in (its environment: local processes).
  install -m 644 scripts/harness_drivers/terminus2_local.py "$DIR/harbor/t1_terminus2.py"
  # pyenv's build finds libpython through a run path under pyenv's root, which sandboxes cannot see.
  cat > "$DIR/harbor/bin/t1-terminus2" <<SH
#!/bin/sh
LD_LIBRARY_PATH=$py312/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $DIR/harbor/bin/python $DIR/harbor/t1_terminus2.py "\$@"
SH
  chmod 755 "$DIR/harbor/bin/t1-terminus2"
fi
