"""The agent's inner user namespace of a local sandbox with an overlay root (T1 running as root).

An overlay sandbox's root keeps a container's capabilities (`t1.sandbox.isolation.bwrap.ROOT_CAPS`: chown,
dac_override, fowner, setuid, kill, ...), which would reach the verifier in a user namespace that
maps its uid. So there are two, nested:
- the outer one, bubblewrap's, owns the sandbox's mount, PID, network, IPC and UTS namespaces and
  maps sandbox ids 0..65535 to the sandbox's host range, except `VERIFIER_UID`, which is the
  verifier's own host uid (`outer_map`). The init (PID 1) and the verifier's sessions live here;
- the inner one, a child of the outer, maps every agent id to itself and leaves the verifier's
  out (`t1.sandbox.isolation.make_agent_userns.INNER_MAP`). Every agent session is its root.

The agent's capabilities hold only in the inner namespace. The kernel grants a capability over a
file only when the file's owner and group are mapped in the caller's namespace, and over a
process or namespace only when it belongs to that namespace or one below: so the agent cannot
become `VERIFIER_UID` (unmapped: setuid fails), write, chown or chmod the verifier's files,
signal or trace the verifier or the init, or mount anything. The verifier's capabilities, held
in the outer namespace, cover the agent's files, since the outer is an ancestor of the inner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from t1.sandbox.isolation.forker import popen
from t1.sandbox.isolation.rootfs import ID_COUNT
from t1.sandbox.verifier.verifier_role import VERIFIER_UID, write_id_map

HELPER = str(Path(__file__).with_name("make_agent_userns.py"))


def outer_map(base: int, verifier_uid: int) -> str:
    """The uid_map (and gid_map) of an overlay sandbox's outer user namespace (pure)."""
    after = VERIFIER_UID + 1
    return f"0 {base} {VERIFIER_UID}\n{VERIFIER_UID} {verifier_uid} 1\n{after} {base + after} {ID_COUNT - after}\n"


def write_outer_map(pid: int, base: int, verifier_uid: int) -> None:
    """Map the agent's range and the verifier's uid in the user namespace of process `pid` (host root only)."""
    write_id_map(pid, outer_map(base, verifier_uid))


def open_agent_userns(sandbox_id: str, init_pid: int) -> int:
    """Make the agent's inner user namespace under that of sandbox init `init_pid`; a descriptor of it.

    Blocking (a helper process; call it off the loop). The caller closes the descriptor when the
    sandbox ends; the namespace lives as long as it or an agent process does.
    """
    proc = popen([sys.executable, "-I", "-S", HELPER, str(init_pid)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        try:
            holder = int(line)
        except ValueError:
            proc.stdin.close()
            proc.wait()
            raise RuntimeError(f"sandbox {sandbox_id}: cannot make the agent's user namespace: "
                               f"{proc.stderr.read().decode(errors='replace').strip() or 'no output'}") from None
        fd = os.open(f"/proc/{holder}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        proc.stdin.close()
        proc.wait()
        return fd
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
