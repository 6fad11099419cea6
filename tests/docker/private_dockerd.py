"""A private Docker engine for tests, and a small base image made from the host's own files.

`PrivateDockerd` runs `dockerd` as root with its own data root, exec root, pid file and unix
socket under a temporary folder, without a bridge or iptables rules (nothing touches the host's
network), and its own containerd namespace; `stop` ends it and everything it started.
`import_base_image` makes `t1-test-base:latest` from the host's bash, coreutils, util-linux
(`setpriv`), python3 and the SFTP server with the libraries they load: no registry is reachable
here, so nothing is pulled (`docker import`).
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import IO

import docker
import docker.errors

from t1.config.sandbox import DockerProviderConfig

BASE_IMAGE = "t1-test-base:latest"
BINARIES = ("bash", "sh", "ls", "cat", "echo", "head", "tail", "sleep", "env", "mkdir", "rm", "cp", "mv", "chmod",
            "touch", "test", "true", "false", "grep", "sed", "wc", "dd", "id", "ps", "kill", "setpriv", "timeout",
            "python3", "stat", "printf", "sort", "tr", "cut", "uname", "hostname", "ln", "readlink", "find", "xargs",
            "nproc", "seq", "yes", "od", "base64", "md5sum", "sha256sum", "tee", "date", "pwd", "whoami", "ip",
            "tar", "gzip", "awk", "mawk", "diff", "chown", "which", "basename", "dirname", "mktemp", "cmp", "du",
            "nohup", "setsid", "pgrep", "pkill", "git")
EXTRA_TREES = (
    "/usr/lib/python3.11",
    "/usr/lib/python3/dist-packages/pygments",
    "/usr/lib/openssh/sftp-server",
    "/etc/passwd",
    "/etc/group",
    "/usr/lib/locale/C.utf8",
)


def docker_config(dockerd: PrivateDockerd, **overrides: object) -> DockerProviderConfig:
    """The docker provider's config for the private engine and its base image (tests' settings as `overrides`)."""
    return DockerProviderConfig(socket=dockerd.socket, default_image=BASE_IMAGE, **overrides)  # type: ignore[arg-type]


class DockerdUnavailable(RuntimeError):
    """The private engine cannot run here (no dockerd, not root, or it did not come up)."""


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else ""
        if path.startswith("/"):
            libs.add(path)
    return libs


def base_tar() -> bytes:
    """A tar of a minimal root: the host's binaries in BINARIES, their libraries and EXTRA_TREES."""
    files: set[str] = set()
    for name in BINARIES:
        found = shutil.which(name, path="/usr/bin:/usr/sbin:/bin:/sbin")
        if found:
            real = os.path.realpath(found)
            files |= {real, *_libraries(real)}
            files.add("/usr/bin/" + name)
    files |= {*_libraries(os.path.realpath("/usr/lib/openssh/sftp-server"))}
    for module in glob.glob("/usr/lib/python3.11/lib-dynload/_ctypes*.so"):  # ctypes (libffi), for probes of the kernel
        files |= _libraries(module)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for link in ("bin", "sbin", "lib", "lib64"):  # the host's merged-/usr links (bin -> usr/bin, ...)
            if os.path.islink(f"/{link}"):
                tar.add(f"/{link}", arcname=link)
        for d in ("app", "tmp", "root", "logs", "tests", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for path in sorted(files | set(EXTRA_TREES)):
            if not os.path.exists(path):
                continue
            real = os.path.realpath(path)
            arc = path.lstrip("/")
            if path.startswith(("/lib/", "/lib64/", "/bin/", "/sbin/")):
                arc = "usr/" + arc
            if os.path.isdir(real):
                tar.add(
                    real, arcname=arc, filter=lambda t: None if "__pycache__" in t.name or "/test/" in t.name else t
                )
            else:
                tar.add(real, arcname=arc)
    return buf.getvalue()


class PrivateDockerd:
    """dockerd on a socket of its own under `root`."""

    def __init__(self, root: Path, data_tmpfs: str | None = None) -> None:
        """`data_tmpfs`: mount options of a tmpfs for the engine's data root (its images and containers' layers), for
        tests that fill a container's storage: bounded there, where the host's disk is not."""
        self.root = root
        self.data_tmpfs = data_tmpfs
        self.socket = root / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        binary = shutil.which("dockerd", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin")
        if binary is None:
            raise DockerdUnavailable("dockerd is not installed (T1_SETUP_DOCKER=1 make setup installs docker.io)")
        if os.geteuid() != 0:
            raise DockerdUnavailable("dockerd needs root")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.data_tmpfs is not None:
            (self.root / "data").mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", self.data_tmpfs, "t1-dockerd-data", str(self.root / "data")],
                           check=True, capture_output=True)
        with open(self.root / "dockerd.log", "wb") as log:
            self.proc = self._spawn(binary, log)
        try:
            self._wait(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, binary: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [binary, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "dockerd.pid"), "-H", f"unix://{self.socket}",
             "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
             "--containerd-namespace", f"t1-test-{os.getpid()}", "--containerd-plugins-namespace",
             f"t1-test-{os.getpid()}-plugins"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def _wait(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-800:]
                raise DockerdUnavailable(f"dockerd exited with {self.proc.returncode}: {tail}")
            if self.socket.exists():
                try:
                    with contextlib.closing(docker.DockerClient(base_url=f"unix://{self.socket}", timeout=5)) as client:
                        client.ping()
                    return
                except docker.errors.DockerException:
                    pass
            time.sleep(0.2)
        raise DockerdUnavailable(f"dockerd did not answer on {self.socket} within {timeout_s:.0f}s")

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"unix://{self.socket}", timeout=120)

    def import_base_image(self) -> None:
        with contextlib.closing(self.client()) as client:
            client.api.import_image_from_data(base_tar(), repository=BASE_IMAGE.split(":")[0], tag="latest")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(docker.errors.DockerException), contextlib.closing(self.client()) as client:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        subprocess.run(["umount", "-R", str(self.root / "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
