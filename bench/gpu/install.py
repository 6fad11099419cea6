"""Unpack the carried wheels into a site folder, skipping what the machine already has at the same or a newer version.

    python bench/gpu/install.py WHEEL_DIR SITE_DIR     # prints what it unpacked and what it kept

A wheel is a zip of the files an installer would place in site-packages, so unpacking it is an
install that needs no pip and no network. The caller puts SITE_DIR first on PYTHONPATH.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import zipfile
from pathlib import Path


def _version_key(v: str) -> tuple:
    try:
        from packaging.version import Version

        return (Version(v),)
    except Exception:  # no packaging, or a version it cannot read: compare as text
        return (v,)


def wheel_name(path: Path) -> tuple[str, str]:
    """(distribution, version) from a wheel's file name (PEP 427: name-version-...whl)."""
    parts = path.name.split("-")
    if len(parts) < 5 or not path.name.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {path.name}")
    return parts[0], parts[1]


def install(wheels: Path, site: Path) -> list[str]:
    """Lines saying, per wheel, whether it was unpacked into `site` or the installed version kept."""
    site.mkdir(parents=True, exist_ok=True)
    lines = []
    for whl in sorted(wheels.glob("*.whl")):
        name, version = wheel_name(whl)
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is not None and _version_key(have) >= _version_key(version):
            lines.append(f"kept    {name} {have} (carried {version})")
            continue
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        lines.append(f"carried {name} {version}" + (f" (over {have})" if have else ""))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheels, site = Path(argv[0]), Path(argv[1])
    if not wheels.is_dir():
        print(f"install: no wheel folder {wheels}: nothing carried", file=sys.stderr)
        return 0
    for line in install(wheels, site):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
