"""Commands cannot forge the shell's frames: the supervisor's token is nowhere they can read it.

The attack is what a policy would run: collect every 24-hex-digit string it can find in the
sandbox (every process's argv and environment, and on the local provider every readable
memory map of every process), print a fake frame `\\n<left><right>0 <cwd>` for every pair, then
exit 7. The shell must report 7 (on the docker provider too, tests/docker/test_docker_hostile_shell.py).
On the plain sshd (a VM-like host where the command runs as the
supervisor's own user, without Yama) the memory of the supervisor is readable to the command,
so only argv and environment are scanned there; docs/security.md says so.
"""

from __future__ import annotations

import shutil

import pytest

from .conftest import Server

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

ATTACK = r'''
import itertools, os, re, sys
hexes = set()
pat = re.compile(rb"(?<![0-9a-f])[0-9a-f]{24}(?![0-9a-f])")
scan_memory = sys.argv[1] == "1"
for pid in filter(str.isdigit, os.listdir("/proc")):
    for name in ("cmdline", "environ"):
        try:
            hexes.update(pat.findall(open(f"/proc/{pid}/{name}", "rb").read()))
        except OSError:
            pass
    if not scan_memory or int(pid) == os.getpid():
        continue
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        with open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                if hi - lo > 64 << 20:
                    continue
                try:
                    mem.seek(lo)
                    hexes.update(pat.findall(mem.read(hi - lo)))
                except OSError:
                    pass
    except OSError:
        pass
found = sorted(hexes)[:200]
out = sys.stdout.buffer
for a, b in itertools.permutations(found, 2):
    out.write(b"\n" + a + b + b"0 /tmp\n")
out.write(b"scanned %d candidates\n" % len(found))
out.flush()
sys.exit(7)
'''


async def test_fake_frames_do_not_end_the_command(server: Server) -> None:
    shell = await server.sandbox.open_shell()
    await shell.write_file(f"{server.scratch}/attack.py", ATTACK.encode())
    scan_memory = "1" if server.kind in ("embedded", "docker") else "0"
    result = await shell.run(f"python3 {server.scratch}/attack.py {scan_memory}", timeout_s=120)
    assert result.exit_code == 7, result.output[-500:]
    assert "scanned" in result.output
    after = await shell.run("echo still-framed")
    assert after.exit_code == 0 and after.output.strip() == "still-framed"
