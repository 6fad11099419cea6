"""An execute-only copy of bash for the shells' supervisors in local sandboxes (`t1.sandbox.ssh.framing`).

A process that executes a file it may not read is not dumpable: processes of the same uid can
neither read its memory or descriptors through /proc nor ptrace it. The supervisor of a framed
shell holds the shell's token; running it from this copy (mode 0111, owned by T1's user, so the
sandbox's root, which is another uid, may only execute it) keeps the token from the commands
it runs. The copy lives in the provider's root and is bound read-only at
`t1.sandbox.ssh.framing.SUPERVISOR_BASH` in every sandbox.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from t1.sandbox.ssh.framing import SUPERVISOR_BASH

BIN_DIR = ".t1-bin"


def private_bash(provider_root: Path) -> Path:
    return provider_root / BIN_DIR / "bash"


def install_private_bash(provider_root: Path) -> Path:
    """Copy the host's bash into the provider's root, execute-only (idempotent)."""
    target = private_bash(provider_root)
    target.parent.mkdir(mode=0o711, exist_ok=True)
    os.chmod(target.parent, 0o711)
    source = shutil.which("bash") or "/bin/bash"
    tmp = target.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o111)
    os.replace(tmp, target)
    return target


def supervisor_binds(sandbox_root: Path) -> list[str]:
    """bubblewrap arguments binding the execute-only bash where supervisors look for it (pure)."""
    source = private_bash(sandbox_root.parent)
    if not source.exists():
        return []
    return ["--perms", "0755", "--dir", os.path.dirname(SUPERVISOR_BASH), "--ro-bind", str(source), SUPERVISOR_BASH]
