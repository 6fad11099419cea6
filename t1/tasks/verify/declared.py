"""The tests a task declares, counted by T1 from its test files on the host (never from what the verifier says).

A verifier's report comes from inside a sandbox the agent used; the agent may have replaced the
python it runs, planted a conftest, or forged a report. What cannot be forged is the task's own
test folder on the host: `declared_tests` parses its Python test files (`test_*.py`,
`*_test.py`) with `ast` and lists every test function pytest would collect (module-level
`test*` functions and `test*` methods of `Test*` classes), with how many cases each has
(the product of its `pytest.mark.parametrize` lists where their length is known: literals,
`range(n)`, a module-level name bound once to one). Where it is not (a list built at run time,
a fixture with params, `pytest_generate_tests`), the function counts as one test (`uncounted`,
folded by `by_function`: passed only when every case passed). `check_report` then refuses a
report that names a test the files do not declare, passes one test id twice, or passes more
tests than they declare: a tampered verifier (see `t1.tasks.verify.rewards`). So the count reward is
bounded by the task's files whatever the report says.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from t1.tasks.verify.report import TestResult, TestStatus

_PARAM_SUFFIX = re.compile(r"\[.*\]$")
_PASSING = (TestStatus.PASSED, TestStatus.XFAIL)


@dataclass(frozen=True, slots=True)
class DeclaredTests:
    """Test functions found in a task's test files, and the most passing tests a report of them can have."""

    functions: frozenset[str]
    num_cases: int
    """Cases of the functions whose count is known, plus one for each of `uncounted`."""
    uncounted: frozenset[str] = frozenset()
    """Functions whose number of cases the files do not say (a parametrization T1 cannot evaluate, a fixture
    with params, a `pytest_generate_tests` hook): each counts as one test, passed only if all its cases passed."""


def _length(node: ast.expr | None, names: dict[str, int]) -> int | None:
    """How many values `node` yields: a literal list/tuple/set/dict, `range(...)` of int literals, a module-level
    name bound to one of those, `list(...)`/`tuple(...)` of one; None otherwise (pure)."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else len(node.elts)
    if isinstance(node, ast.Dict):
        return None if any(k is None for k in node.keys) else len(node.keys)
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in ("list", "tuple") and len(node.args) == 1:
            return _length(node.args[0], names)
        if node.func.id == "range" and 1 <= len(node.args) <= 3:
            ints = [a.value for a in node.args if isinstance(a, ast.Constant) and type(a.value) is int]
            return len(range(*ints)) if len(ints) == len(node.args) else None
    return None


def _parametrize_cases(decorator: ast.expr, names: dict[str, int]) -> int | None:
    """Cases one `@pytest.mark.parametrize(names, values)` adds a factor of; 1 for other decorators."""
    if not isinstance(decorator, ast.Call):
        return 1
    func = decorator.func
    if not (isinstance(func, ast.Attribute) and func.attr == "parametrize"):
        return 1
    values = decorator.args[1] if len(decorator.args) > 1 else next(
        (k.value for k in decorator.keywords if k.arg == "argvalues"), None)
    return _length(values, names)


def _cases(node: ast.FunctionDef | ast.AsyncFunctionDef, class_factor: int | None, names: dict[str, int]) -> int | None:
    total: int | None = class_factor
    for decorator in node.decorator_list:
        factor = _parametrize_cases(decorator, names)
        total = None if factor is None or total is None else total * factor
    return total


def _class_factor(node: ast.ClassDef, names: dict[str, int]) -> int | None:
    factors = [_parametrize_cases(d, names) for d in node.decorator_list]
    return None if None in factors else math.prod(f for f in factors if f is not None)


def _is_testcase(node: ast.ClassDef) -> bool:
    """A `unittest.TestCase` subclass, which pytest collects whatever its name."""
    return any(
        (isinstance(b, ast.Attribute) and b.attr == "TestCase") or (isinstance(b, ast.Name) and b.id == "TestCase")
        for b in node.bases
    )


def _module_lengths(tree: ast.Module) -> dict[str, int]:
    """Module-level names bound once to something of known length (`CASES = [...]`, `N = range(5)`)."""
    names: dict[str, int] = {}
    bound: dict[str, int] = {}
    for node in tree.body:
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                bound[target.id] = bound.get(target.id, 0) + 1
                length = _length(value, names)
                if length is not None:
                    names[target.id] = length
    return {name: n for name, n in names.items() if bound[name] == 1}


def generates_cases(source: str) -> bool:
    """Whether a test file parametrizes beyond its decorators: a fixture with params or a pytest_generate_tests hook
    (pure)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "pytest_generate_tests":
            return True
        if isinstance(node, ast.Call) and any(k.arg == "params" for k in node.keywords):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "fixture":
                return True
    return False


def declared_in_source(source: str, filename: str = "<tests>") -> tuple[dict[str, int | None], str | None]:
    """Test functions of one file and their case counts, or the syntax error that hid them (pure)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return {}, f"{filename}: {exc.msg} (line {exc.lineno})"
    names = _module_lengths(tree)
    found: dict[str, int | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found[node.name] = _cases(node, 1, names)
        elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or _is_testcase(node)):
            factor = _class_factor(node, names)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    key = f"{node.name}::{item.name}"
                    found[key] = _cases(item, factor, names)
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
    generated = any(generates_cases(p.read_text(encoding="utf-8", errors="replace"))
                    for p in [*sorted(tests_dir.rglob("*.py")), *files] if p.is_file())
    cases: dict[str, int | None] = {}
    for path in files:
        found, error = declared_in_source(path.read_text(encoding="utf-8", errors="replace"), path.name)
        if error is not None:
            return None  # pytest cannot collect it either; the run reports that itself
        for name, n in found.items():
            cases[name] = None if generated or n is None or name in cases else n
    uncounted = frozenset(name for name, n in cases.items() if n is None)
    return DeclaredTests(frozenset(cases), sum(n or 1 for n in cases.values()), uncounted)


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


def collection_error(test: TestResult) -> bool:
    """Whether a reported result is pytest's collection error of a module (`ERROR tests/test_x.py - ...`; pure)."""
    name = test.name.strip()
    return test.status is TestStatus.ERROR and "::" not in name and name.endswith(".py")


def check_report(tests: tuple[TestResult, ...], declared: DeclaredTests) -> str:
    """Why `tests` cannot come from the declared tests ('' when they can; pure)."""
    # a skipped test is reported by location, not by id: it passes nothing, so it is not checked
    # nor is a collection error (an ERROR naming a file, not a test: it passes nothing, and the attempt may cause one)
    unknown = sorted({function_of(t.name) for t in tests
                      if t.status is not TestStatus.SKIPPED and not collection_error(t)} - declared.functions)
    if unknown:
        return (f"the verifier reported {len(unknown)} test(s) the task's test files do not declare "
                f"(e.g. {unknown[0]!r})")
    passed = [_test_id(t.name) for t in tests if t.status in _PASSING]
    repeated = sorted(name for name, n in Counter(passed).items() if n > 1)
    if repeated:
        return f"the verifier reported {len(repeated)} test(s) passed more than once (e.g. {repeated[0]!r})"
    num_passed = sum(t.status in _PASSING for t in by_function(tests, declared))
    if num_passed > declared.num_cases:
        return f"{num_passed} tests passed but the task's test files declare {declared.num_cases}"
    return ""


def _test_id(name: str) -> str:
    """A reported test's id as pytest collects it: its function and its parameters (`Class::test[1-2]`)."""
    params = _PARAM_SUFFIX.search(name.strip())
    return function_of(name) + (params.group(0) if params else "")


def by_function(tests: tuple[TestResult, ...], declared: DeclaredTests) -> tuple[TestResult, ...]:
    """`tests` with the cases of each uncounted function folded into one result, passed only when all passed (pure)."""
    if not declared.uncounted:
        return tests
    folded: dict[str, list[TestResult]] = {}
    out: list[TestResult] = []
    for test in tests:
        function = function_of(test.name)
        if function in declared.uncounted:
            if function not in folded:
                folded[function] = []
                out.append(test)  # its place, filled below
            folded[function].append(test)
        else:
            out.append(test)
    for i, test in enumerate(out):
        cases = folded.get(function_of(test.name))
        if cases is None or test is not cases[0]:
            continue
        name = function_of(test.name)
        bad = [c for c in cases if c.status not in (*_PASSING, TestStatus.SKIPPED)]
        if bad:
            out[i] = replace(bad[0], name=name)
        else:
            out[i] = TestResult(
                name, TestStatus.PASSED if any(c.status in _PASSING for c in cases) else TestStatus.SKIPPED
            )
    return tuple(out)
