"""One exception tree: every exception class under t1/ derives from t1.errors.T1Error and is drawn in
t1/errors.py's docstring; what the episode counts as an infra error is InfraError's subtree.

The classes are read with `ast` (nothing heavy is imported); private control-flow exceptions (a leading
underscore) are left out, as the tree says.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import t1.errors
from t1.errors import BadRequest, DataError, InfraError, StorageError, T1Error

ROOT = Path(__file__).resolve().parents[1] / "t1"


def class_bases(root: Path = ROOT) -> dict[str, list[str]]:
    """Every class under `root` by name, with the names of its bases (the last part of a dotted base)."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if "v1" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = [b.attr if isinstance(b, ast.Attribute) else b.id if isinstance(b, ast.Name) else ""
                         for b in node.bases]
                out.setdefault(node.name, []).extend(names)
    return out


def ancestors(name: str, bases: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for base in bases.get(todo.pop(), []):
            if base not in seen:
                seen.add(base)
                todo.append(base)
    return seen


def is_builtin_exception(name: str) -> bool:
    obj = getattr(builtins, name, None)
    return isinstance(obj, type) and issubclass(obj, BaseException)


def exception_classes(bases: dict[str, list[str]]) -> set[str]:
    """Public classes whose ancestry reaches a builtin exception (T1Error's own Exception included)."""
    return {name for name in bases if not name.startswith("_")
            and any(is_builtin_exception(a) for a in ancestors(name, bases))}


def test_every_exception_class_derives_from_t1error() -> None:
    bases = class_bases()
    outside = sorted(n for n in exception_classes(bases) if n != "T1Error" and "T1Error" not in ancestors(n, bases))
    assert not outside, f"exception classes outside the tree (derive them from a t1.errors base): {outside}"


def test_the_tree_drawing_names_every_exception_class_and_no_other() -> None:
    bases = class_bases()
    doc = t1.errors.__doc__ or ""
    drawn = {line.split("──", 1)[1].split()[0] for line in doc.splitlines() if "──" in line}
    drawn.add("T1Error")
    have = exception_classes(bases)
    assert not sorted(have - drawn), f"t1/errors.py's drawing lacks {sorted(have - drawn)}"
    assert not sorted(drawn - have), f"t1/errors.py's drawing names classes that do not exist: {sorted(drawn - have)}"


def test_the_checks_see_a_class_outside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class T1Error(Exception): ...\nclass Good(T1Error): ...\n"
                                   "class Bad(ValueError): ...\nclass _Private(Exception): ...\nclass Plain: ...\n")
    bases = class_bases(tmp_path)
    assert exception_classes(bases) == {"T1Error", "Good", "Bad"}
    assert "T1Error" not in ancestors("Bad", bases) and "T1Error" in ancestors("Good", bases)


def test_classes_keep_their_builtin_bases_and_sit_in_their_branch() -> None:
    """`except ValueError` / `except RuntimeError` around T1 code catch what they caught before the tree."""
    from t1.config.loader import ConfigError
    from t1.rpc.errors import NotFound, RequestError
    from t1.sandbox.needs import NeedsImageError
    from t1.sandbox.types import SandboxGone, SandboxLost
    from t1.tasks.transfer import SetupError
    from t1.tasks.verify.outcome import T1Fault
    from t1.trajectory.serialization import CodecError
    from t1.workdir import DirectoryBusy

    assert issubclass(NeedsImageError, InfraError) and issubclass(NeedsImageError, ValueError)
    assert issubclass(SetupError, InfraError) and issubclass(SetupError, RuntimeError)
    assert issubclass(SandboxGone, SandboxLost) and issubclass(SandboxLost, InfraError)
    assert issubclass(T1Fault, InfraError)
    assert issubclass(RequestError, BadRequest) and issubclass(RequestError, ValueError)
    assert issubclass(NotFound, BadRequest) and issubclass(NotFound, LookupError)
    assert issubclass(ConfigError, BadRequest)
    assert issubclass(DirectoryBusy, StorageError) and issubclass(StorageError, RuntimeError)
    assert issubclass(CodecError, DataError) and issubclass(CodecError, ValueError)
    assert all(issubclass(c, T1Error) for c in (InfraError, BadRequest, StorageError, DataError))


def test_the_episode_classifies_by_infraerror_not_by_provider() -> None:
    from t1.agent import episode
    from t1.sandbox.ssh.remote import SandboxCreateError

    assert (InfraError, OSError, TimeoutError) == episode.INFRA_ERRORS
    assert isinstance(SandboxCreateError("no host"), episode.INFRA_ERRORS)
    source = (ROOT / "agent" / "episode.py").read_text()
    assert not any(name in source for name in ("t1.sandbox.ssh.remote", "t1.sandbox.docker", "t1.sandbox.local"))


def test_each_class_in_the_tree_names_the_module_that_defines_it() -> None:
    """`Name  [pkg.module]` in the drawing: t1/pkg/module.py defines `class Name` (moves keep the map true)."""
    import re

    doc = t1.errors.__doc__ or ""
    labelled = re.findall(r"(\w+)\s+\[([\w.]+)\]", doc)
    assert len(labelled) > 20
    wrong = []
    for name, label in labelled:
        path = ROOT.joinpath(*label.split(".")).with_suffix(".py")
        if not path.exists() or not re.search(rf"^class {name}\b", path.read_text(), re.MULTILINE):
            wrong.append(f"{name} [{label}]")
    assert not wrong, f"labels that name no module defining the class: {wrong}"
