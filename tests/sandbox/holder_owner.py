"""A stand-in T1 process for the holder-lifetime tests: `python holder_owner.py ROOT MODE`.

MODE `sandboxes`: a local provider on ROOT with an overlay sandbox (with internet, where slirp4netns
is installed) and a read-only-root one, each running a background job and a detached daemon; prints `ready` and the
holders' host pids, then
waits to be killed. MODE `lifeline-closed`: the same, then, after a line on stdin, it closes its lifeline's write end
(as
its death would) and stays alive. MODE `stuck-bwrap`: a bubblewrap over ROOT/sb-stuck whose child
waits forever for uid maps: its outer process is killed with this one (--die-with-parent) while
`keeper` holds the block pipe, the way a run killed mid-start leaves one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.isolation import holders
from t1.sandbox.isolation.netns import SLIRP
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest


async def sandboxes(root: Path, close_lifeline: bool) -> None:
    inits = []
    for overlay in (True, False):
        provider = LocalProvider(LocalProviderConfig(root=root / ("overlay" if overlay else "ro"), overlay=overlay),
                                 ShellConfig())
        box = await provider.create(SandboxRequest(allow_network=overlay and shutil.which(SLIRP) is not None))
        shell = await box.open_shell()
        await shell.run("sleep 1000 & setsid sleep 1001 > /dev/null 2>&1 < /dev/null & echo started")
        inits.append(provider.server._inits[box.id].target.pid)
    print("ready", *inits, flush=True)
    if close_lifeline:  # once the test has read the holders' namespaces (a line on stdin)
        await asyncio.to_thread(sys.stdin.readline)
        assert holders._pipe is not None
        os.close(holders._pipe[1])
        print("closed", flush=True)
    await asyncio.sleep(3600)


def stuck_bwrap(root: Path) -> None:
    (root / "sb-stuck" / "app").mkdir(parents=True)
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    keeper = subprocess.Popen(["sleep", "3600"], pass_fds=(block_w,))
    os.close(block_w)
    bwrap = subprocess.Popen(
        ["bwrap", "--unshare-user", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/",
         "--bind", str(root / "sb-stuck" / "app"), "/app", "--info-fd", str(info_w), "--userns-block-fd", str(block_r),
         "--", "/bin/true"], pass_fds=(info_w, block_r))
    os.close(info_w)
    os.close(block_r)
    info = b""
    while b"}" not in info:
        info += os.read(info_r, 4096)
    print("ready", keeper.pid, bwrap.pid, flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    where, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "stuck-bwrap":
        stuck_bwrap(where)
    else:
        asyncio.run(sandboxes(where, close_lifeline=mode == "lifeline-closed"))
