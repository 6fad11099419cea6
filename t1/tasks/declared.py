"""The tests a task declares, counted by T1 from its test files on the host (never from what the verifier says).

A verifier's report comes from inside a sandbox the agent used; the agent may have replaced the
python it runs, planted a conftest, or forged a report. What cannot be forged is the task's own
test folder on the host: `declared_tests` parses its Python test files (`test_*.py`,
`*_test.py`) with `ast` and lists every test function pytest would collect (module-level
`test*` functions and `test*` methods of `Test*` classes), with how many cases each has
(the product of its literal `pytest.mark.parametrize` lists; None when a list is not literal).
`check_report` then refuses a report that names a test the files do not declare or passes more
cases than they declare: a tampered verifier (see `t1.tasks.rewards`).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from pathlib import Path

from t1.tasks.report import TestResult, TestStatus

_PARAM_SUFFIX = re.compile(r"\[.*\]$")


@dataclass(frozen=True, slots=True)
class DeclaredTests:
    """Test functions found in a task's test files, and the number of cases they declare."""

    functions: frozenset[str]
    num_cases: int | None
    """Sum of cases over all functions; None when some parametrization is not a literal list."""


def _parametrize_cases(decorator: ast.expr) -> int | None:
    """Cases one `@pytest.mark.parametrize(names, values)` adds a factor of; 1 for other decorators."""
    if not isinstance(decorator, ast.Call):
        return 1
    func = decorator.func
    if not (isinstance(func, ast.Attribute) and func.attr == "parametrize"):
        return 1
    values = decorator.args[1] if len(decorator.args) > 1 else next(
        (k.value for k in decorator.keywords if k.arg == "argvalues"), None)
    if isinstance(values, (ast.List, ast.Tuple, ast.Set)):
        return len(values.elts)
    return None


def _cases(node: ast.FunctionDef | ast.AsyncFunctionDef, class_factor: int | None) -> int | None:
    total: int | None = class_factor
    for decorator in node.decorator_list:
        factor = _parametrize_cases(decorator)
        total = None if factor is None or total is None else total * factor
    return total


def _class_factor(node: ast.ClassDef) -> int | None:
    factors = [_parametrize_cases(d) for d in node.decorator_list]
    return None if None in factors else math.prod(f for f in factors if f is not None)


def _is_testcase(node: ast.ClassDef) -> bool:
    """A `unittest.TestCase` subclass, which pytest collects whatever its name."""
    return any((isinstance(b, ast.Attribute) and b.attr == "TestCase") or (isinstance(b, ast.Name) and b.id == "TestCase")
               for b in node.bases)


def declared_in_source(source: str, filename: str = "<tests>") -> tuple[dict[str, int | None], str | None]:
    """Test functions of one file and their case counts, or the syntax error that hid them (pure)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return {}, f"{filename}: {exc.msg} (line {exc.lineno})"
    found: dict[str, int | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found[node.name] = _cases(node, 1)
        elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or _is_testcase(node)):
            factor = _class_factor(node)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    key = f"{node.name}::{item.name}"
                    found[key] = _cases(item, factor)
    return found, None


def _test_files(tests_dir: Path) -> list[Path]:
    root = tests_dir.resolve()
    files = [p for p in sorted(tests_dir.rglob("*.py")) if p.name.startswith("test_") or p.name.endswith("_test.py")]
    return [p for p in files if p.resolve().is_relative_to(root)]


def declared_tests(tests_dir: Path, extra_files: tuple[Path, ...] = ()) -> DeclaredTests | None:
    """The tests a task's folder declares; None when it has no Python test file (nothing to bound by)."""
    files = _test_files(tests_dir) + [p for p in extra_files if p.is_file()]
    if not files:
        return None
    functions: set[str] = set()
    total: int | None = 0
    for path in files:
        found, error = declared_in_source(path.read_text(encoding="utf-8", errors="replace"), path.name)
        if error is not None:
            return None  # pytest cannot collect it either; the run reports that itself
        for name, cases in found.items():
            functions.add(name)
            total = None if cases is None or total is None else total + cases
    return DeclaredTests(frozenset(functions), total)


def function_of(test_name: str) -> str:
    """`[Class::]function` of a reported test id (pytest node id, JUnit classname::name, CTRF name; pure)."""
    parts = [p for p in _PARAM_SUFFIX.sub("", test_name.strip()).replace(" ", "").split("::") if p]
    if not parts:
        return ""
    if len(parts) >= 2 and not parts[-2].endswith(".py"):
        owner = parts[-2].split(".")[-1]
        if owner[:1].isupper():  # a class (pytest `Test*`, or a `unittest.TestCase`), not a module
            return f"{owner}::{parts[-1]}"
    return parts[-1].split(".")[-1]


def check_report(tests: tuple[TestResult, ...], declared: DeclaredTests) -> str:
    """Why `tests` cannot come from the declared tests ('' when they can; pure)."""
    # a skipped test is reported by location, not by id: it passes nothing, so it is not checked
    unknown = sorted({function_of(t.name) for t in tests if t.status is not TestStatus.SKIPPED} - declared.functions)
    if unknown:
        return (f"the verifier reported {len(unknown)} test(s) the task's test files do not declare "
                f"(e.g. {unknown[0]!r})")
    passed = sum(t.status in (TestStatus.PASSED, TestStatus.XFAIL) for t in tests)
    if declared.num_cases is not None and passed > declared.num_cases:
        return f"{passed} tests passed but the task's test files declare {declared.num_cases}"
    return ""
