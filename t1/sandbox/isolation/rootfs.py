"""The copy-on-write root of a local sandbox: the host's root through an overlay of its own.

With T1 running as root, each bubblewrap sandbox gets, in a private mount namespace
(`t1.sandbox.isolation.mountns`), a tmpfs of `storage_mb` at its tree's path holding everything the
sandbox can write: the tree dirs (`app`, `logs`, `tests`, `tmp`, `home`) and the overlay's upper
and work dirs. The overlay's lower layer is the host's root filesystem (that mount only, not the
host's /proc, /sys, /dev, /run or other mounts) seen through an idmapped mount: host uid N is
sandbox uid N for N below 65,536, so the sandbox's root owns `/etc/passwd` and `/usr/bin` as a
container's root does; the sandbox's user namespace maps sandbox uids 0..65535 to its own host
range (`ID_COUNT` ids from its base uid), which no other sandbox shares, but for the verifier's
uid (`t1.sandbox.isolation.agent_userns`). Writes anywhere land in
the upper layer on the tmpfs: the host never changes, and a sandbox that fills its tmpfs gets
ENOSPC. The namespace dies with the sandbox's last process, and the tmpfs with it.

What the host keeps to itself (`host_masks`, built once per process): top-level entries other
than the system dirs are hidden (`/work`, `/boot`, ...; `/home`, `/mnt`, `/srv`, `/media` are
empty), and so is every file the host keeps from other users (not world-readable, such as SSH
host keys: an empty file in its place) or directory (not world-searchable: an empty directory);
`/etc/shadow` and `/etc/gshadow` keep their entries with every password locked. The sandbox's
root could read those through the idmapping, where today's nobody-owned view could not.
The account files (`/etc/passwd`, `/etc/group`, their shadows and backups) keep the image's
accounts only, as a container starts with: root, the system users and groups, and nobody; the
host's own users (ids from login.defs' UID_MIN..UID_MAX, GID_MIN..GID_MAX) and their group
memberships are left out, so a task's `useradd -u 1000` gets the id as it would in its container.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from t1.sandbox.isolation.mountns import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MS_NODEV,
    MS_NOSUID,
    MS_SHARED,
    detached_mount,
    idmapped_clone,
    mount,
)

log = logging.getLogger(__name__)

ID_COUNT = 65536
"""Uids (and gids) per sandbox: sandbox ids 0..65535 are host ids base..base+65535."""
UPPER, WORK, ROOTFS = ".upper", ".work", "rootfs"
BASE, SETUP = ".base", ".setup"
"""The pristine system's top layer (`pristine_mount`): the masks alone, until setup ends; then a copy
of the upper layer as setup left it (`snapshot_setup`)."""
SYSTEM_TOP = ("usr", "etc", "opt", "var", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
MOUNTED_TOP = ("proc", "dev", "run", "sys")
"""Kept as the (empty) mount points they are on the host's root filesystem."""
EMPTY_TOP = ("home", "mnt", "srv", "media", "root", "tmp", "app", "logs", "tests")
"""Present and empty (the tree dirs are mounted over theirs)."""
SHADOW_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")
ACCOUNT_FILES = ("/etc/passwd", "/etc/passwd-", "/etc/group", "/etc/group-", *SHADOW_FILES)
KEPT_PRIVATE = ("/etc/sudoers", "/etc/sudoers.d")
"""Root-only but no secret, and a container's root reads them: `sudo` run by root needs its rules."""
_NOBODY = 65534


class MaskKind(StrEnum):
    HIDE = "hide"
    EMPTY_DIR = "empty_dir"
    EMPTY_FILE = "empty_file"
    ACCOUNTS = "accounts"


@dataclass(frozen=True, slots=True)
class Mask:
    """One host path the sandbox sees differently: hidden, emptied, or with its passwords locked."""

    path: str
    kind: MaskKind
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    content: bytes = b""


def _locked(text: bytes) -> bytes:
    """shadow/gshadow lines with the password field locked (`*`), keeping everything else."""
    lines = []
    for line in text.split(b"\n"):
        fields = line.split(b":")
        if len(fields) > 2:
            fields[1] = b"!" if fields[1].startswith(b"!") else b"*"
        lines.append(b":".join(fields))
    return b"\n".join(lines)


def _login_range(kind: str, defs: str = "/etc/login.defs") -> range:
    """The ids `useradd`/`groupadd` give regular accounts (kind UID or GID): the host's own users' range."""
    bounds = {f"{kind}_MIN": 1000, f"{kind}_MAX": 60000}
    try:
        lines = Path(defs).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] in bounds and words[1].isdigit():
            bounds[words[0]] = int(words[1])
    return range(bounds[f"{kind}_MIN"], bounds[f"{kind}_MAX"] + 1)


def _host_accounts() -> tuple[set[bytes], set[bytes]]:
    """Names of the host's regular users and groups (in /etc/passwd, /etc/group): what an image does not have."""
    found: list[set[bytes]] = []
    for file, ids in (("/etc/passwd", _login_range("UID")), ("/etc/group", _login_range("GID"))):
        names = set()
        with open(file, "rb") as handle:
            for line in handle.read().split(b"\n"):
                fields = line.split(b":")
                if len(fields) > 2 and fields[2].isdigit() and int(fields[2]) in ids:
                    names.add(fields[0])
        found.append(names)
    return found[0], found[1]


def image_accounts(path: str, text: bytes, users: set[bytes], groups: set[bytes]) -> bytes:
    """An account file without the host's users and groups (`users`, `groups`), nor their memberships."""
    is_group = "group" in path or "gshadow" in path
    gone = groups if is_group else users
    lines = []
    for line in text.split(b"\n"):
        fields = line.split(b":")
        if len(fields) > 2 and fields[0] in gone:
            continue
        if is_group and len(fields) > 3:
            fields[-1] = b",".join(m for m in fields[-1].split(b",") if m and m not in users)
            if "gshadow" in path:
                fields[2] = b",".join(m for m in fields[2].split(b",") if m and m not in users)
        lines.append(b":".join(fields))
    out = b"\n".join(lines)
    return _locked(out) if path in SHADOW_FILES else out


def _mask_for(path: str, st: os.stat_result) -> Mask | None:
    if stat.S_ISLNK(st.st_mode) or path in KEPT_PRIVATE:
        return None
    mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    if path in ACCOUNT_FILES and stat.S_ISREG(st.st_mode):
        with open(path, "rb") as file:
            return Mask(path, MaskKind.ACCOUNTS, mode, uid, gid, image_accounts(path, file.read(), *_host_accounts()))
    if stat.S_ISDIR(st.st_mode):
        return None if st.st_mode & 0o005 == 0o005 else Mask(path, MaskKind.EMPTY_DIR, mode, uid, gid)
    if st.st_mode & 0o004 or (st.st_size == 0 and stat.S_ISREG(st.st_mode)):
        return None
    return Mask(path, MaskKind.EMPTY_FILE, mode, uid, gid)


def _scan(top: str, dev: int, out: list[Mask]) -> None:
    """Masks for what under `top` (on the root filesystem `dev`) the host keeps from other users."""
    try:
        entries = list(os.scandir(top))
    except OSError as exc:
        log.warning("sandbox root: cannot scan %s (%s); hiding it", top, exc)
        out.append(Mask(top, MaskKind.HIDE))
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_dev != dev:
            continue  # another filesystem mounted here: not part of the lower layer
        mask = _mask_for(entry.path, st)
        if mask is not None:
            out.append(mask)
        elif stat.S_ISDIR(st.st_mode) and entry.path not in KEPT_PRIVATE:
            _scan(entry.path, dev, out)


def host_masks(tree_parent: str) -> tuple[Mask, ...]:
    """Every mask of the host's root (scanned once per process: a few seconds), and `tree_parent`
    hidden when it lies in a system dir (other sandboxes' mount points)."""
    top = tree_parent.split("/")[1] if tree_parent.startswith("/") and tree_parent != "/" else ""
    return _scan_host() + ((Mask(tree_parent, MaskKind.HIDE),) if top in SYSTEM_TOP else ())


@functools.cache
def _scan_host() -> tuple[Mask, ...]:
    dev = os.stat("/").st_dev
    masks: list[Mask] = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in MOUNTED_TOP:
            continue
        if name in EMPTY_TOP:
            masks.append(Mask(path, MaskKind.EMPTY_DIR))
        elif name not in SYSTEM_TOP:
            masks.append(Mask(path, MaskKind.HIDE))
        elif os.path.isdir(path) and not os.path.islink(path) and os.stat(path).st_dev == dev:
            _scan(path, dev, masks)
    return tuple(masks)


@functools.cache
def separate_system_mounts() -> tuple[str, ...]:
    """System dirs on a filesystem of their own: not in the lower layer, so bound read-only as before."""
    dev = os.stat("/").st_dev
    return tuple("/" + name for name in SYSTEM_TOP
                 if os.path.isdir("/" + name) and not os.path.islink("/" + name) and os.stat("/" + name).st_dev != dev)


def _owner(host_id: int, base: int) -> int:
    """The host id that shows as `host_id` inside the sandbox whose ids start at `base`."""
    return base + (host_id if host_id < ID_COUNT else _NOBODY)


def _make_parents(upper: Path, path: str, base: int) -> None:
    """The directories above `path` in the upper layer, with the owner and mode of the host's."""
    current = upper
    host = Path("/")
    for part in Path(path).parts[1:-1]:
        current, host = current / part, host / part
        if not current.exists():
            st = os.lstat(host)
            current.mkdir()
            os.chown(current, _owner(st.st_uid, base), _owner(st.st_gid, base))
            os.chmod(current, stat.S_IMODE(st.st_mode))


def write_masks(upper: Path, base: int, masks: tuple[Mask, ...]) -> None:
    """Put the masks into a fresh upper layer (before the overlay is mounted)."""
    for mask in masks:
        target = upper / mask.path.lstrip("/")
        _make_parents(upper, mask.path, base)
        if mask.kind is MaskKind.HIDE:
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))  # an overlay whiteout
            continue
        if mask.kind is MaskKind.EMPTY_DIR:
            target.mkdir()
            os.setxattr(target, "trusted.overlay.opaque", b"y")
        else:
            target.write_bytes(mask.content)
        os.chown(target, _owner(mask.uid, base), _owner(mask.gid, base))
        os.chmod(target, mask.mode)


def check_overlay_path(root: Path) -> None:
    """The overlay's options are a comma- and colon-separated string: the tree path must not contain those."""
    bad = sorted(set(str(root)) & set(",:\\\n"))
    if bad:
        raise ValueError(f"sandbox root {root}: characters {bad} cannot appear in an overlay mount's options; "
                         "choose a sandbox.local.root without them")


INODES_PER_MB = 64
"""Inodes a sandbox's tmpfs allows per MiB of `storage_mb` (10 GiB: 655,360), so empty files cannot fill the
kernel's memory (a tmpfs's default is half the host's RAM in pages: millions, filled in seconds)."""
MIN_INODES = 65536


def mount_verifier_storage(root: Path, verifier_uid: int, size_mb: int, names: tuple[str, ...]) -> None:
    """In the sandbox's new mount namespace: a tmpfs of the verifier's own on each of its dirs under `root`, so an
    agent that filled the sandbox's storage or inodes leaves its verifier the space to run."""
    for name in names:
        mount("tmpfs", str(root / name), "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={size_mb}m,nr_inodes={max(MIN_INODES, size_mb * INODES_PER_MB)},mode=0700,"
              f"uid={verifier_uid},gid={verifier_uid}")


def mount_storage(root: Path, base: int, storage_mb: int, masks: tuple[Mask, ...], tree_dirs: tuple[str, ...]) -> None:
    """In the sandbox's new mount namespace: its tmpfs at `root`, the tree dirs, the upper layer with its masks.

    The tmpfs is a shared mount, so the overlay mounted on it after the sandbox's bubblewrap has
    made its namespace (`mount_overlay`) appears there too.
    """
    inodes = max(MIN_INODES, storage_mb * INODES_PER_MB)
    mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={storage_mb}m,nr_inodes={inodes},mode=0700,uid={base},gid={base}")
    mount(None, str(root), None, MS_SHARED)
    for name in tree_dirs:
        (root / name).mkdir()
        os.chown(root / name, base, base)
    os.chmod(root / "tmp", 0o1777)
    (root / WORK).mkdir(mode=0o700)
    (root / ROOTFS).mkdir(mode=0o755)
    for layer in (UPPER, BASE):
        (root / layer).mkdir(mode=0o755)
        os.chown(root / layer, base, base)
        write_masks(root / layer, base, masks)


def snapshot_argv(root: Path) -> list[str]:
    """Copy the upper layer as setup left it to `SETUP` (pure; run in the sandbox's outer mount namespace).

    `cp -a` keeps owners, modes, whiteouts (character devices 0/0) and the overlay's `trusted.*`
    xattrs (opaque directories, redirects), so the copy is a valid lower layer over the same host.
    """
    return ["cp", "-a", "--no-target-directory", "--", str(root / UPPER), str(root / SETUP)]


def pristine_mount(root: Path, userns_fd: int, sealed: bool) -> int:
    """A read-only overlay of the sandbox's pristine system, attached nowhere yet; its descriptor.

    Lower layers: the setup snapshot (`sealed`) or the masks alone, over the host's root idmapped
    by `userns_fd`, exactly as the agent's root was before the agent acted. Call it in the
    sandbox's outer mount namespace (where `root` is its tmpfs).
    """
    lower = idmapped_clone("/", userns_fd)
    try:
        top = root / (SETUP if sealed else BASE)
        return detached_mount("overlay", {"lowerdir": f"{top}:/proc/self/fd/{lower}"},
                              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    finally:
        os.close(lower)


def mount_overlay(root: Path, userns_fd: int) -> None:
    """In the sandbox's namespace holder: the overlay at `root/rootfs`, lower the host's root idmapped by
    `userns_fd`."""
    lower = idmapped_clone("/", userns_fd)
    try:
        mount("overlay", str(root / ROOTFS), "overlay", MS_NOSUID | MS_NODEV,
              f"lowerdir=/proc/self/fd/{lower},upperdir={root / UPPER},workdir={root / WORK}")
    finally:
        os.close(lower)
