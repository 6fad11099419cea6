"""Task files stay in the task: every path under a task folder must resolve inside it, or the task is refused.

T1 reads task folders on the host as its own user (root on a T1 machine): the instruction
becomes the prompt, solutions and test scripts are read and uploaded, environment files are
copied into the sandbox, and their contents reach reports. A hostile task folder could point
any of them elsewhere (`instruction.md -> /etc/shadow`, `tests/data -> /root/.ssh`).
`check_contained` walks the whole folder without following links and refuses the task, naming
the file, when a symlink resolves outside the folder or an entry is not a plain file, folder or
contained symlink (a FIFO would hang the loader, a device would be read raw). Hard links to
files the folder's owner may not read are already refused by the kernel
(fs.protected_hardlinks).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from t1.tasks.spec import TaskParseError


def outside_path(root: Path, path: Path) -> str:
    """Why `path` (inside `root`'s tree) may not be read as part of the task, or '' (pure but for stat)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(mode):
        target = path.resolve()
        if not target.is_relative_to(root):
            return f"is a symlink to {target}, outside the task folder"
        return "" if target.exists() else f"is a dangling symlink (to {os.readlink(path)})"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    return "is neither a file nor a folder (a FIFO, socket or device)"


def check_contained(task_root: Path) -> None:
    """Refuse the task folder at `task_root` if anything in it leads outside it (TaskParseError naming the file)."""
    root = task_root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            problem = outside_path(root, path)
            if problem:
                raise TaskParseError(path, str(path.relative_to(root)), problem)
