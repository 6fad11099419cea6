"""The import graph of t1/: layers only point down, and no module imports itself through others.

Read from the source with `ast` (nothing is imported). Every import counts, wherever it sits:
at the top of a module, inside a function (a deferred import is still a dependency) or under
`if TYPE_CHECKING:` (a type is a dependency too). The layers, lowest first (docs/design.md):

    0  t1.v1 t1.config t1.workdir t1.logsetup t1.errors   wire types, the config schema, the work dir, errors
    1  t1.metrics t1.trajectory t1.evals                  metrics, trajectory records and files, eval statistics
    2  t1.model t1.routing                                model files, MoE routing records
    3  t1.rpc                                             gRPC servers, clients, tensors on the wire
    4  t1.inference t1.trainer                            the two GPU planes
    5  t1.tito                                            token-in token-out buffers over inference results
    6  t1.sandbox                                         sandboxes and shells
    7  t1.tasks                                           task folders, provisioning, verifiers, image builds
    8  t1.agent t1.gateway t1.model.init t1.model.corpus  episodes; the harness gateway; making a model
                                                          (its tokenizer trains on the curriculum's tool calls)
    9  t1.view                                            the run viewer (reads what the run wrote)
    10 t1.coordinator                                     the run's driver and its services
    11 t1.cli                                             command lines

A module may import from its own layer or any lower one. A module's layer is that of the longest
entry naming it or a package above it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "t1"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("t1", "t1.v1", "t1.config", "t1.workdir", "t1.logsetup", "t1.errors"),
    ("t1.metrics", "t1.trajectory", "t1.evals"),
    ("t1.model", "t1.routing"),
    ("t1.rpc",),
    ("t1.inference", "t1.trainer"),
    ("t1.tito",),
    ("t1.sandbox",),
    ("t1.tasks",),
    ("t1.agent", "t1.gateway", "t1.model.init", "t1.model.corpus"),
    ("t1.view",),
    ("t1.coordinator",),
    ("t1.cli",),
)


@dataclass(frozen=True, slots=True)
class Edge:
    """`source` imports `target` at `line` of its file."""

    source: str
    target: str
    line: int


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module under t1/ by dotted name (a package by its name, for its __init__.py)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    """Every t1 module `name` imports, each as the most precise module the statement names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "t1" or alias.name.startswith("t1."):
                    yield Edge(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module != "t1" and not module.startswith("t1."):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield Edge(name, sub if sub in modules else module, node.lineno)


@functools.cache
def graph(root: Path = ROOT) -> tuple[dict[str, Path], list[Edge]]:
    modules = module_files(root)
    return modules, [e for name, path in modules.items() for e in imports(name, path, modules) if e.target != name]


def layer_of(module: str) -> int:
    """The layer of the longest entry that is `module` or a package above it ("t1" names only t1/__init__.py)."""
    matches = [(len(entry), level) for level, entries in enumerate(LAYERS) for entry in entries
               if module == entry or (entry != "t1" and module.startswith(entry + "."))]
    if not matches:
        raise KeyError(module)
    return max(matches)[1]


def circles(modules: dict[str, Path], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    succ: dict[str, list[str]] = {m: [] for m in modules}
    for e in edges:
        if e.target in succ:
            succ[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    modules, _ = graph()
    unplaced = []
    for name in modules:
        try:
            layer_of(name)
        except KeyError:
            unplaced.append(name)
    assert not unplaced, f"modules in no layer (add their package to LAYERS and docs/design.md): {unplaced}"


def test_imports_only_point_down() -> None:
    modules, edges = graph()
    upward = [f"{modules[e.source].relative_to(ROOT.parent)}:{e.line}: {e.source} (layer {layer_of(e.source)}) "
              f"imports {e.target} (layer {layer_of(e.target)})"
              for e in edges if layer_of(e.target) > layer_of(e.source)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    modules, edges = graph()
    found = circles(modules, edges)
    assert not found, "import circles (every import counts, deferred and TYPE_CHECKING ones too):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_checks_see_upward_imports_and_circles(tmp_path: Path) -> None:
    """The graph reader on a small tree: a deferred upward import and a TYPE_CHECKING circle are both caught."""
    pkg = tmp_path / "t1"
    for sub in ("config", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "a.py").write_text("def f():\n    from t1.cli.main import run\n")
    (pkg / "config" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "config" / "c.py").write_text("from t1.config.b import x\n")
    (pkg / "cli" / "main.py").write_text("import json\n")
    modules, edges = graph(pkg)
    up = [e for e in edges if layer_of(e.target) > layer_of(e.source)]
    assert up == [Edge("t1.config.a", "t1.cli.main", 2)]
    assert circles(modules, edges) == [["t1.config.b", "t1.config.c"]]
