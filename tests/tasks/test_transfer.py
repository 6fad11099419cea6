"""File moves into and out of a real local sandbox: small ones through the shell itself (no file-transfer session),
large ones, and every case the shell cannot do, through Shell.write_file / read_file, byte-exact either way."""

from __future__ import annotations

import os
from pathlib import Path

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import CommandResult, SandboxRequest, Shell, ShellRole
from t1.tasks.transfer import INLINE_MAX_BYTES, read_if_exists, upload_dir_contents


class Counted:
    """A shell whose file-transfer calls are counted (everything else goes straight to the real one)."""

    def __init__(self, shell: Shell) -> None:
        self.shell, self.reads, self.writes = shell, 0, 0

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        return await self.shell.run(command, timeout_s)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.writes += 1
        await self.shell.write_file(path, data, mode)

    async def read_file(self, path: str) -> bytes:
        self.reads += 1
        return await self.shell.read_file(path)

    async def close(self) -> None:
        await self.shell.close()


async def test_small_files_move_through_the_shell_and_large_ones_as_files(provider: LocalProvider,
                                                                         tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    (small / "test.sh").write_text("#!/bin/bash\necho ok\n")
    os.chmod(small / "test.sh", 0o755)
    (large / "data.bin").write_bytes(os.urandom(4 * INLINE_MAX_BYTES))  # does not compress below the limit
    sandbox = await provider.create(SandboxRequest())
    try:
        shell = Counted(await sandbox.open_shell(role=ShellRole.VERIFIER))
        await upload_dir_contents(shell, small, "/tmp/in-small")
        assert shell.writes == 0
        assert (await shell.run("/tmp/in-small/test.sh", 10)).output.strip() == "ok"  # the mode came along
        await upload_dir_contents(shell, large, "/tmp/in-large")
        assert shell.writes == 1

        binary = bytes(range(256)) * 8 + b"\x00\n\r\n"  # every byte value, NULs and line ends: 2,052 bytes
        await shell.write_file("/tmp/bin.dat", binary)
        await shell.run(f"head -c {INLINE_MAX_BYTES} /dev/urandom > /tmp/edge.dat; : > /tmp/empty.dat", 10)
        reads = shell.reads
        assert await read_if_exists(shell, "/tmp/bin.dat") == binary
        assert await read_if_exists(shell, "/tmp/empty.dat") == b""
        edge = await read_if_exists(shell, "/tmp/edge.dat")
        assert edge is not None and len(edge) == INLINE_MAX_BYTES
        assert await read_if_exists(shell, "/tmp/missing") is None and await read_if_exists(shell, "/tmp") is None
        assert shell.reads == reads, "small files, folders and missing paths need no file transfer"
        assert await read_if_exists(shell, "/tmp/in-large/data.bin") == (large / "data.bin").read_bytes()
        assert shell.reads == reads + 1

        # A sandbox whose shell has no working base64: both ways fall back to the file transfer.
        await shell.run("base64() { return 127; }", 10)
        writes = shell.writes
        await upload_dir_contents(shell, small, "/tmp/in-fallback")
        assert shell.writes == writes + 1 and (await shell.run("/tmp/in-fallback/test.sh", 10)).output.strip() == "ok"
        assert await read_if_exists(shell, "/tmp/bin.dat") == binary and shell.reads == reads + 2
        await shell.close()
    finally:
        await provider.destroy(sandbox)
