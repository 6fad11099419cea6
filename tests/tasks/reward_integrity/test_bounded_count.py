"""The count reward is bounded by the task's test files: declared ids only, none twice, no more cases than the
files can produce, functions counted where the cases cannot be known.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from t1.sandbox.types import SandboxProvider
from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import VerifierKind
from t1.tasks.verify.declared import DeclaredTests, check_report, declared_in_source, declared_tests
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task
from t1.tasks.verify.report import FailureMode, TestResult, TestStatus
from t1.tasks.verify.rewards import RewardMode, episode_reward
from t1.tasks.verify.verifier import build_report
from tasks.reward_integrity.attacks import (
    harbor_task,
    quote,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_declared_tests_count_parametrized_cases(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import pytest\n@pytest.mark.parametrize('x', [1, 2, 3])\ndef test_p(x): pass\n"
        "def test_q(): pass\nclass TestK:\n    @pytest.mark.parametrize('y', (1, 2))\n    def test_m(self, y): pass\n"
        "def helper(): pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b_test.py").write_text("import unittest\nclass Case(unittest.TestCase):\n"
                                                "    def test_u(self): pass\n")
    declared = declared_tests(tmp_path)
    assert declared == DeclaredTests(frozenset({"test_p", "test_q", "TestK::test_m", "Case::test_u"}), 3 + 1 + 2 + 1)
    found, _ = declared_in_source("import pytest\nVALS = [1, 2]\nN = range(2, 7)\nLATER = []\nLATER = [1]\n"
                                  "@pytest.mark.parametrize('x', VALS)\n@pytest.mark.parametrize('y', list(N))\n"
                                  "def test_d(x, y): pass\n"
                                  "@pytest.mark.parametrize('x', range(4))\ndef test_r(x): pass\n"
                                  "@pytest.mark.parametrize('x', [str(i) for i in range(9)])\ndef test_c(x): pass\n"
                                  "@pytest.mark.parametrize('x', LATER)\ndef test_l(x): pass\n")
    assert found == {"test_d": 10, "test_r": 4, "test_c": None, "test_l": None}  # None: not known from the file
    assert declared_tests(tmp_path / "sub" / "none") is None


def test_a_case_count_the_files_do_not_say_counts_functions(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("import pytest\nCASES = [str(i) for i in range(6)]\n"
                                        "@pytest.mark.parametrize('c', CASES)\ndef test_case(c): pass\n"
                                        "def test_one(): pass\n")
    declared = declared_tests(tmp_path)
    assert declared == DeclaredTests(frozenset({"test_case", "test_one"}), 2, frozenset({"test_case"}))
    forged = tuple(TestResult(f"test_a.py::test_case[{i}]", TestStatus.PASSED) for i in range(100_000))
    report = build_report(VerifierKind.PYTEST, "", {"ctrf.json": ctrf(forged)}, exit_code=0, timed_out=False,
                          declared=declared)
    assert report.failure_mode is FailureMode.NONE and (report.passed, report.total) == (1, 1)
    one_failed = (*forged[:5], TestResult("test_a.py::test_case[5]", TestStatus.FAILED, "boom"))
    report = build_report(VerifierKind.PYTEST, "", {"ctrf.json": ctrf(one_failed)}, exit_code=1, timed_out=False,
                          declared=declared)
    assert (report.passed, report.total, report.tests[0].message) == (0, 1, "boom")
    (tmp_path / "conftest.py").write_text("import pytest\n@pytest.fixture(params=range(3))\n"
                                          "def n(request): return request.param\n")
    assert declared_tests(tmp_path) == DeclaredTests(frozenset({"test_case", "test_one"}), 2,
                                                     frozenset({"test_case", "test_one"}))
    repeated = tuple(TestResult("test_a.py::test_one", TestStatus.PASSED) for _ in range(2))
    assert "more than once" in check_report(repeated, declared)


def ctrf(tests: tuple[TestResult, ...]) -> str:
    return json.dumps(
        {"results": {"tests": [{"name": t.name, "status": str(t.status), "message": t.message} for t in tests]}}
    )


def test_reports_beyond_the_declared_tests_are_tampered() -> None:
    declared = DeclaredTests(frozenset({"test_a", "TestK::test_b"}), 2)
    honest = (TestResult("../tests/test_outputs.py::test_a", TestStatus.PASSED),
              TestResult("tests.test_outputs.TestK::test_b", TestStatus.FAILED))
    assert check_report(honest, declared) == ""
    renamed = (TestResult("test_outputs.py::test_forged", TestStatus.PASSED),)
    assert "do not declare" in check_report(renamed, declared)
    collection = TestResult("../tests/test_outputs.py", TestStatus.ERROR, "ModuleNotFoundError: No module named 'x'")
    assert check_report((collection,), declared) == ""  # a module pytest could not collect passes nothing
    assert "do not declare" in check_report((*renamed, collection), declared)
    assert "do not declare" in check_report((TestResult("forged.py", TestStatus.PASSED),), declared)
    repeated = tuple(TestResult(f"test_outputs.py::test_a[{i}]", TestStatus.PASSED) for i in range(3))
    assert "declare 2" in check_report(repeated, declared)
    output = "=== short test summary info ===\n" + "".join(f"PASSED t.py::test_a[{i}]\n" for i in range(50)) + \
        "=== 50 passed in 0.1s ===\n"
    report = build_report(VerifierKind.PYTEST, output, {}, exit_code=0, timed_out=False, declared=declared)
    assert report.failure_mode is FailureMode.VERIFIER_TAMPERED and report.passed == 50
    for mode in RewardMode:
        assert episode_reward(report, mode) == 0.0


COUNT_TESTS = """import pytest
CASES = [str(i) for i in range(6)]

def test_app_exists():
    assert __import__("os").path.isdir("/app")

@pytest.mark.parametrize("case", CASES)
def test_case(case):
    import solution
    assert solution.double(case) == 2 * int(case)
"""
COUNT_FORGER = ("import atexit, json\n\ndef double(case):\n    return 0\n\n"
                "def _forge():\n    tests = [{'name': f'test_outputs.py::test_case[{i}]', 'status': 'passed'} for i in "
                "range(100000)]\n"
                "    json.dump({'results': {'tests': tests}}, open('/logs/verifier/ctrf.json', 'w'))\n\n"
                "atexit.register(_forge)\n")


@pytest.mark.parametrize("solution", ["honest", "forged"])
async def test_a_forged_count_is_bounded_by_the_test_files(provider: SandboxProvider, tmp_path: Path, solution: str,
                                                            harbor_base: str) -> None:
    """Cases from a list built at run time: a report of 100,000 passed cases (written by the agent's module, which the
    tests import) scores no more than the task's functions; the real solution scores the same."""
    root = harbor_task(tmp_path / solution, "python3 -m pytest /tests/test_outputs.py -rA --ctrf "
                                            "/logs/verifier/ctrf.json",
                        "true\n", harbor_base)
    (root / "tests" / "test_outputs.py").write_text(COUNT_TESTS)
    code = "def double(case):\n    return 2 * int(case)\n" if solution == "honest" else COUNT_FORGER
    (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\nprintf '%s' {quote(code)} > /app/solution.py\n")
    run = await run_task(
        provider, load_task(root), RunMode.ORACLE, reward_mode=RewardMode.COUNT
    )
    assert run.status is RunStatus.OK, (run.as_json(), run.report.output_tail)
    expected = (2.0, 2) if solution == "honest" else (1.0, 1)  # the forger's doubles are wrong: 1 as an honest failure
    assert (run.reward, run.report.passed) == expected, (run.as_json(), run.report.output_tail)
