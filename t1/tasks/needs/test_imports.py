"""Packages a task's Python tests import that neither the host nor the task provides: a need, known in advance.

A test module that imports a package the sandbox's python3 does not have fails at pytest's
collection, whatever the attempt did. That is the host's lack, not the attempt's failure, so
it must be a needs_network report naming the module, never a score. It is decided from the
task folder and the host alone, before anything runs (the same function for validate and for
a run), so no attempt can turn its own failure into one: a module counts as the host's lack
only when it is a top-level import of a test file, not in the standard library, not a module
or package anywhere in the task folder, not named by the reference solution, the Dockerfile or
the test scripts (where the task itself installs it, or the agent is meant to write it: those
are the installers' predictions, or the attempt's to provide), and not importable by the
sandbox's python3.

`broken_test_files` is the same kind of fact: a test file (or conftest.py) the sandbox's python3
cannot compile fails collection whatever the attempt does, so the task is in error (a setup
failure naming the file, line and cause, before the agent acts; validate calls it malformed). A
collection error that compiling the task's own files does not predict (a module the attempt was
to write, module-level code reading its output) is the attempt's: scored, never blamed on the task.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from t1.sandbox.isolation.bwrap import SANDBOX_PATH
from t1.tasks.spec import TaskSpec

_T1_SHIPS = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "packaging"})
"""Shipped with the verifier's toolchain when the sandbox lacks them (t1.tasks.toolchain)."""
_COMPILE = ("import json, sys\nbad = {}\nfor p in sys.argv[1:]:\n    try:\n"
            "        compile(open(p, 'rb').read(), p, 'exec')\n"
            "    except (SyntaxError, ValueError) as e:\n"
            "        bad[p] = (f'line {e.lineno}: ' if getattr(e, 'lineno', None) else '') + f'{type(e).__name__}: "
            "{e.msg if isinstance(e, SyntaxError) else e}'\n"
            "print(json.dumps(bad))")
_PROBE = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))"


def _test_files(dirs: list[Path]) -> list[Path]:
    return [p for d in dirs if d.is_dir() for p in sorted(d.rglob("*.py"))
            if p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"]


def _top_imports(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return []
    names = []
    for node in tree.body:  # module level only: what collection itself imports
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return names


def _provided_by_task(name: str, root: Path, texts: str) -> bool:
    if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w])", texts):
        return True
    return any(root.rglob(f"{name}.py")) or any(p.is_dir() for p in root.rglob(name))


def _sandbox_python(script: str, args: list[str]) -> str:
    """What `script` prints under the sandbox's python3 (this interpreter where the host has none)."""
    result = subprocess.run(["python3", "-c", script, *args], capture_output=True, text=True,
                            env={"PATH": SANDBOX_PATH}, timeout=60, check=False)
    if result.returncode != 0:
        result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                                timeout=60, check=False)
    return result.stdout


def _not_importable(names: list[str]) -> list[str]:
    return _sandbox_python(_PROBE, names).split() if names else []


def _tests_dirs(spec: TaskSpec) -> list[Path]:
    return list(dict.fromkeys(d for p in spec.phases() for d in (p.verifier.tests_dir, *p.verifier.extra_tests_dirs)))


def broken_test_files(spec: TaskSpec) -> list[str]:
    """`path line N: Error: message` for each of the task's test files the sandbox's python3 cannot compile."""
    files = _test_files(_tests_dirs(spec))
    if not files:
        return []
    bad: dict[str, str] = json.loads(_sandbox_python(_COMPILE, [str(f) for f in files]) or "{}")
    return [f"{Path(p).relative_to(spec.root) if Path(p).is_relative_to(spec.root) else p} {why}"
            for p, why in bad.items()]


def missing_test_imports(spec: TaskSpec) -> list[str]:
    """The packages the task's test files import that this host lacks and the task does not provide (see module doc)."""
    dirs = _tests_dirs(spec)
    texts = []
    for p in spec.phases():
        for f in (p.solution.script if p.solution else None, p.verifier.run_tests_sh, p.verifier.tests_dir / "test.sh"):
            if f is not None and f.is_file():
                texts.append(f.read_text(encoding="utf-8", errors="replace"))
        texts += list(p.solution.commands) if p.solution else []
    if spec.environment.dockerfile is not None:
        texts.append(spec.environment.dockerfile.read_text(encoding="utf-8", errors="replace"))
    joined = "\n".join(texts)
    candidates = dict.fromkeys(n for f in _test_files(dirs) for n in _top_imports(f)
                               if n not in sys.stdlib_module_names and n not in _T1_SHIPS)
    wanted = [n for n in candidates if not _provided_by_task(n, spec.root, joined)]
    return _not_importable(wanted)


def uncollectable(spec: TaskSpec) -> str:
    """Why pytest cannot collect the task's tests whatever the attempt does ('' when it can, as far as compiling
    tells)."""
    broken = broken_test_files(spec)
    return (f"verifier: {'; '.join(broken)}: the task's test file does not compile under the sandbox's python3, "
            "so pytest cannot collect it whatever the attempt does") if broken else ""
