"""Move files into a sandbox through the Shell protocol alone: one tar.gz write and one `tar -x` per upload.

Only `Shell.write_file`, `Shell.read_file`, `Shell.write_from` and `Shell.run` are used, so this works over SSH/SFTP, on
any provider, and keeps file modes (executable scripts stay executable). A small archive or file
(`INLINE_MAX_BYTES`) goes through the shell itself, base64-encoded in the command or its output: a
shell's file transfers start a session of their own (over SSH an SFTP subsystem; for a local
verifier one more entry into the sandbox), which cost more than a cheap verifier's whole run. A
sandbox without `base64`, or output the shell truncated, falls back to the file transfer.
"""

from __future__ import annotations

import base64
import binascii
import io
import shlex
import tarfile
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from t1.errors import InfraError
from t1.sandbox.types import CommandResult, Shell

INLINE_MAX_BYTES = 8192
"""Archives and files up to this size move through the shell (base64: 10,924 characters, under the shells'
default output cap of 16,384 bytes); larger ones through Shell.write_file / read_file."""


class SetupError(InfraError, RuntimeError):
    """Preparing the sandbox failed: the message names the step and gives a one-line cause.

    `output_tail` keeps the end of the failing command's output for reports that show it in full.
    """

    def __init__(self, message: str, *, output_tail: str = "") -> None:
        super().__init__(message)
        self.output_tail = output_tail


def one_line_cause(output: str) -> str:
    """The line of a failed command's output that most likely says why: the last error-looking line, else the last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    for line in reversed(lines):
        if any(w in line.lower() for w in ("error", "not found", "no such", "denied", "cannot", "failed", "unable")):
            return line[:240]
    return lines[-1][:240]


async def check(shell: Shell, command: str, what: str, timeout_s: float = 120.0) -> CommandResult:
    """Run a command that must succeed; SetupError with a one-line cause (and the output tail) otherwise."""
    result = await shell.run(command, timeout_s=timeout_s)
    if result.timed_out:
        raise SetupError(f"{what}: timed out after {timeout_s:.0f}s", output_tail=result.output[-2000:])
    if result.exit_code != 0:
        raise SetupError(f"{what}: exit code {result.exit_code}: {one_line_cause(result.output)}",
                         output_tail=result.output[-2000:])
    return result


def tar_entries(entries: Iterable[tuple[Path, str]]) -> bytes:
    """A tar.gz whose members are the given local files/folders at the given archive names (recursively)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for local, arcname in entries:
            tar.add(str(local), arcname=arcname, recursive=True, filter=_clean)
    return buf.getvalue()


def _clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if "__pycache__" in info.name.split("/"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _unpack(remote_dir: str) -> str:
    """The command that unpacks the tar.gz on its stdin into `remote_dir` (created if missing)."""
    dest = shlex.quote(remote_dir)
    return f"mkdir -p {dest} && tar -xzf - -C {dest} --no-same-owner"


async def upload_archive(shell: Shell, archive: bytes, remote_dir: str, what: str) -> None:
    """Unpack a tar.gz into `remote_dir` (created if missing)."""
    if len(archive) <= INLINE_MAX_BYTES:
        encoded = base64.b64encode(archive).decode("ascii")
        inline = await shell.run(f"( printf %s {encoded} | base64 -d | {{ {_unpack(remote_dir)}; }} )", timeout_s=120.0)
        if inline.exit_code == 0 and not inline.timed_out:
            return
    await _unpack_staged(shell, remote_dir, what, lambda staged: shell.write_file(staged, archive, 0o600))


async def upload_archive_file(shell: Shell, archive: Path, remote_dir: str, what: str) -> None:
    """Unpack the host's tar.gz file `archive` into `remote_dir`, streamed: memory bounded whatever its size."""
    await _unpack_staged(shell, remote_dir, what, lambda staged: shell.write_from(archive, staged, 0o600))


async def _unpack_staged(shell: Shell, remote_dir: str, what: str, put: Callable[[str], Awaitable[None]]) -> None:
    """`put` the archive at a staging path in the destination (unpredictable name: a verifier's upload lands on its
    own storage, not the agent's /tmp), then unpack it there and remove it."""
    dest = shlex.quote(remote_dir)
    staged = f"{remote_dir.rstrip('/')}/.t1-upload-{uuid.uuid4().hex}.tgz"
    await check(shell, f"mkdir -p {dest}", f"create {remote_dir}")
    await put(staged)
    await check(shell, f"( {{ {_unpack(remote_dir)}; }} < {staged}; s=$?; rm -f {staged}; exit $s "
                       ")", f"upload {what} to {remote_dir}")


async def upload_dir_contents(shell: Shell, local_dir: Path, remote_dir: str, exclude: tuple[str, ...] = ()) -> None:
    """Copy the contents of a local folder into a sandbox folder."""
    entries = [(p, p.name) for p in sorted(local_dir.iterdir()) if p.name not in exclude]
    if entries:
        await upload_archive(shell, tar_entries(entries), remote_dir, str(local_dir))
    else:
        await check(shell, f"mkdir -p {shlex.quote(remote_dir)}", f"create {remote_dir}")


async def path_kind(shell: Shell, path: str) -> str:
    """'dir', 'file' or 'none' for a path in the sandbox."""
    q = shlex.quote(path)
    result = await shell.run(f"if [ -d {q} ]; then echo dir; elif [ -e {q} ]; then echo file; else echo none; fi", 30)
    return result.output.strip().splitlines()[-1] if result.output.strip() else "none"


_KINDS = ("dir", "inline", "file", "none")


async def read_if_exists(shell: Shell, path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist (or is a folder). A regular file of at most
    INLINE_MAX_BYTES comes back in the one command that looks for it."""
    q = shlex.quote(path)
    result = await shell.run(f"if [ -d {q} ]; then echo dir; elif [ -f {q} ] && [ -r {q} ]; then echo inline; "
                             f"head -c {INLINE_MAX_BYTES + 1} {q} | base64 -w0 && echo; "
                             f"elif [ -e {q} ]; then echo file; else echo none; fi", 30)
    lines = result.output.split("\n")
    at = next((i for i, line in enumerate(lines) if line in _KINDS), None)  # past anything the shell printed first
    if at is None:
        return await shell.read_file(path)
    kind = lines[at]
    if kind == "inline" and result.exit_code == 0 and not result.truncated:
        try:
            data: bytes | None = base64.b64decode("".join(lines[at + 1:]).strip(), validate=True)
        except (binascii.Error, ValueError):
            data = None
        if data is not None and len(data) <= INLINE_MAX_BYTES:
            return data
    if kind in ("dir", "none"):
        return None
    return await shell.read_file(path)  # large, unreadable by the shell, or not a regular file
