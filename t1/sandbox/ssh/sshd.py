"""A throwaway OpenSSH server on a loopback port, for tests and benchmarks of the sandbox plane.

Everything lives in one temporary directory: sshd_config, host key, a client key T1 generates,
authorized_keys and a known_hosts entry. Logins are by that key as the current user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from t1.sandbox.ssh.ssh_sandbox import SshEndpoint

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Sshd:
    """A running OpenSSH server and what a client needs to reach it."""

    port: int
    pid: int
    user: str
    key_file: Path
    known_hosts: Path
    workdir: Path

    def endpoint(self) -> SshEndpoint:
        return SshEndpoint(host="127.0.0.1", port=self.port, user=self.user,
                           client_keys=(str(self.key_file),), known_hosts=str(self.known_hosts))

    def kill_sessions(self) -> int:
        """SIGKILL every per-connection sshd process (the server side of live sessions)."""
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True).stdout.split()
        for pid in out:
            os.kill(int(pid), signal.SIGKILL)
        return len(out)


class SshdProcess:
    """Start with `start()`, stop with `stop()`; `info` describes the running server."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="t1-sshd-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.info: Sshd | None = None

    def start(self, timeout_s: float = 10.0) -> Sshd:
        if not os.access(SSHD, os.X_OK):
            raise FileNotFoundError(f"{SSHD} not found: install openssh-server")
        work = self.work
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key")], check=True)
        client = asyncssh.generate_private_key("ssh-ed25519")
        client.write_private_key(str(work / "client_key"))
        (work / "client_key").chmod(0o600)
        (work / "authorized_keys").write_bytes(client.export_public_key())
        port = free_port()
        kind, key = (work / "host_key.pub").read_text().split()[:2]
        (work / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
        (work / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work}/host_key\nPidFile {work}/sshd.pid\n"
            f"AuthorizedKeysFile {work}/authorized_keys\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
            "MaxStartups 2000\nMaxSessions 1000\nLogLevel ERROR\n"
        )
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # OpenSSH's privilege-separation directory
        self._proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(work / "sshd_config")], stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read().decode() if self._proc.stderr and self._proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"sshd did not start on port {port}: {err}")
            time.sleep(0.05)
        user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        self.info = Sshd(port, self._proc.pid, user, work / "client_key", work / "known_hosts", work)
        return self.info

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)
        shutil.rmtree(self.work, ignore_errors=True)
