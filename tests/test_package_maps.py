"""Every package under t1/ opens with a map of its modules: its __init__ docstring names each module
(`name.py`) and each subpackage (`name/`) it holds, and names none it does not hold.

Read with `ast` (nothing is imported).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "t1"

# A map line: "- name.py: ..." / "- a.py, b.py: ..." / "  name.py   ..." (the names before the job's text).
ENTRY = re.compile(r"^\s*(?:- )?((?:`?[\w]+(?:\.py|/)`?(?:, | and | / |, and )?)+)(?::|\s{2,}| --| —)")
NAME = re.compile(r"`?([\w]+(?:\.py|/))`?")


def packages(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in root.rglob("__init__.py"))


def held(package: Path) -> set[str]:
    """The modules (`name.py`) and subpackages (`name/`) a package holds."""
    names = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    return names


def mapped(package: Path) -> tuple[set[str], set[str]]:
    """(every `name.py` / `name/` the docstring mentions, the names that open a map line)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    mentioned = {m.group(1) for m in re.finditer(r"(?<![\w./])([\w]+(?:\.py|/))(?![\w/])", doc)}
    entries = set()
    for line in doc.splitlines():
        m = ENTRY.match(line)
        if m:
            entries |= {n.group(1) for n in NAME.finditer(m.group(1))}
    return mentioned, entries


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_package_opens_with_a_map_of_its_modules(package: Path) -> None:
    mentioned, entries = mapped(package)
    have = held(package)
    missing = sorted(have - mentioned)
    assert not missing, f"{package.relative_to(ROOT.parent)}/__init__.py: its docstring's map lacks {missing}"
    stale = sorted(entries - have)
    assert not stale, f"{package.relative_to(ROOT.parent)}/__init__.py: its map names {stale}, which it does not hold"


def test_the_check_sees_a_missing_and_a_stale_entry(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "__init__.py").write_text("")
    for name in ("a.py", "b.py"):
        (pkg / name).write_text("")
    (pkg / "__init__.py").write_text('"""A package.\n\n- a.py: the first.\n- gone.py: moved away.\n"""\n')
    mentioned, entries = mapped(pkg)
    assert held(pkg) - mentioned == {"b.py", "sub/"}
    assert entries - held(pkg) == {"gone.py"}
