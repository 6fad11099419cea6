"""Verifier output parsing, failure classification and reward math (pure functions)."""

from __future__ import annotations

import json

import pytest

from t1.tasks.spec import MultiStepStrategy, StepSpec, VerifierKind, VerifierSpec
from t1.tasks.verify.report import (
    FailureMode,
    RewardFileError,
    TestResult,
    TestStatus,
    VerifierReport,
    parse_ctrf,
    parse_junit,
    parse_pytest_output,
    parse_reward_json,
    parse_reward_txt,
)
from t1.tasks.verify.rewards import (
    RewardMode,
    checkpoint_turns,
    combine_steps,
    episode_reward,
    passes_gate,
    process_rewards,
)
from t1.tasks.verify.verifier import build_report

PYTEST_RA = """\
============================= test session starts ==============================
collected 5 items

../tests/test_outputs.py .F.sx                                           [100%]

=================================== FAILURES ===================================
___________________________________ test_two ___________________________________
    def test_two():
>       assert 1 == 2
E       assert 1 == 2
=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_one
PASSED ../tests/test_outputs.py::test_three
SKIPPED [1] ../tests/test_outputs.py:12: not on this platform
XFAIL ../tests/test_outputs.py::test_five - known bug
FAILED ../tests/test_outputs.py::test_two - assert 1 == 2
ERROR ../tests/test_outputs.py::test_six - fixture 'db' not found
=================== 1 failed, 2 passed, 1 skipped, 1 xfailed, 1 error in 0.05s ===================
"""


def test_pytest_ra_parsing() -> None:
    tests = parse_pytest_output(PYTEST_RA)
    assert tests is not None
    by_name = {t.name: t.status for t in tests}
    assert by_name["../tests/test_outputs.py::test_one"] is TestStatus.PASSED
    assert by_name["../tests/test_outputs.py::test_two"] is TestStatus.FAILED
    assert by_name["../tests/test_outputs.py::test_five"] is TestStatus.XFAIL
    assert by_name["../tests/test_outputs.py::test_six"] is TestStatus.ERROR
    assert by_name["../tests/test_outputs.py:12: not on this platform"] is TestStatus.SKIPPED
    report = VerifierReport(tests=tests)
    assert (report.passed, report.failed, report.errors, report.total) == (3, 1, 1, 5)
    assert not report.resolved


def test_garbage_and_empty_pytest_output() -> None:
    assert parse_pytest_output("Traceback (most recent call last):\n  boom\nPASSED nothing here\n") is None
    assert parse_pytest_output("") is None
    assert parse_pytest_output("=== no tests ran in 0.01s ===\n") == ()


def test_ctrf_and_junit() -> None:
    ctrf = json.dumps({"results": {"tool": {"name": "pytest"}, "tests": [
        {"name": "test_a", "status": "passed"}, {"name": "test_b", "status": "failed"},
        {"name": "test_c", "status": "skipped"}, {"name": "test_d", "status": "other"}]}})
    assert parse_ctrf(ctrf) == (TestResult("test_a", TestStatus.PASSED), TestResult("test_b", TestStatus.FAILED),
                                TestResult("test_c", TestStatus.SKIPPED), TestResult("test_d", TestStatus.ERROR))
    assert parse_ctrf("{not json") is None and parse_ctrf('{"results": {}}') is None
    junit = ('<testsuites><testsuite name="s"><testcase classname="t" name="ok"/>'
             '<testcase classname="t" name="bad"><failure message="x"/></testcase>'
             '<testcase classname="t" name="err"><error/></testcase>'
             '<testcase classname="t" name="skip"><skipped/></testcase></testsuite></testsuites>')
    assert [(t.name, t.status) for t in parse_junit(junit) or ()] == [
        ("t::ok", TestStatus.PASSED), ("t::bad", TestStatus.FAILED), ("t::err", TestStatus.ERROR),
        ("t::skip", TestStatus.SKIPPED)]
    assert parse_junit("<testsuite><testcase") is None


def test_reward_files() -> None:
    assert parse_reward_txt(" 0.75\n") == (("reward", 0.75),)
    assert parse_reward_json('{"reward": 1, "safety": 0.5}') == (("reward", 1.0), ("safety", 0.5))
    assert parse_reward_json("0.5") == (("reward", 0.5),)
    for bad_txt in ("banana", "nan", ""):
        with pytest.raises(RewardFileError):
            parse_reward_txt(bad_txt)
    for bad_json in ("[1]", '{"reward": "high"}', "{", '{"reward": true}'):
        with pytest.raises(RewardFileError):
            parse_reward_json(bad_json)


@pytest.mark.parametrize(("kind", "output", "files", "exit_code", "timed_out", "mode"), [
    (VerifierKind.TEST_SH, PYTEST_RA, {"reward.txt": "0\n"}, 0, False, FailureMode.NONE),
    (VerifierKind.TEST_SH, "", {}, 0, True, FailureMode.VERIFIER_TIMEOUT),
    (VerifierKind.TEST_SH, "oops", {}, 3, False, FailureMode.VERIFIER_CRASHED),
    (VerifierKind.TEST_SH, PYTEST_RA, {}, 0, False, FailureMode.REWARD_FILE_MISSING),
    (VerifierKind.TEST_SH, "", {"reward.txt": "banana"}, 0, False, FailureMode.REWARD_FILE_INVALID),
    (VerifierKind.PYTEST, "garbage, not pytest", {}, 0, False, FailureMode.UNPARSABLE_OUTPUT),
    (VerifierKind.RUN_TESTS_SH, "bash: uv: command not found", {}, 127, False, FailureMode.VERIFIER_CRASHED),
    (VerifierKind.PYTEST, "=== no tests ran in 0.01s ===", {}, 5, False, FailureMode.NO_TESTS),
    (VerifierKind.PYTEST, PYTEST_RA, {}, 1, False, FailureMode.NONE),
])
def test_build_report_classifies(kind: VerifierKind, output: str, files: dict[str, str | None],
                                 exit_code: int, timed_out: bool, mode: FailureMode) -> None:
    report = build_report(kind, output, files, exit_code=exit_code, timed_out=timed_out)
    assert report.failure_mode is mode
    assert report.detail or mode is FailureMode.NONE


def test_ctrf_wins_over_stdout() -> None:
    ctrf = json.dumps({"results": {"tests": [{"name": "only", "status": "passed"}]}})
    report = build_report(VerifierKind.TEST_SH, PYTEST_RA, {"ctrf.json": ctrf, "reward.txt": "1"},
                          exit_code=0, timed_out=False)
    assert [t.name for t in report.tests] == ["only"] and report.resolved


def _report(passed: int, failed: int, reward: float | None = None) -> VerifierReport:
    tests = tuple(TestResult(f"p{i}", TestStatus.PASSED) for i in range(passed))
    tests += tuple(TestResult(f"f{i}", TestStatus.FAILED) for i in range(failed))
    return VerifierReport(tests=tests, reward_values=(("reward", reward),) if reward is not None else ())


def test_reward_modes() -> None:
    partial, full = _report(3, 1), _report(4, 0)
    assert episode_reward(partial) == 3.0 and episode_reward(partial, "fraction") == 0.75
    assert episode_reward(partial, RewardMode.BINARY) == 0.0 and episode_reward(full, RewardMode.BINARY) == 1.0
    assert episode_reward(_report(4, 0, reward=0.0), RewardMode.BINARY) == 0.0  # the reward file has the last word
    reward_only = VerifierReport(reward_values=(("reward", 1.0),))
    assert (reward_only.passed, reward_only.total, reward_only.resolved) == (1, 1, True)
    broken = VerifierReport(tests=full.tests, failure_mode=FailureMode.VERIFIER_TIMEOUT)
    assert episode_reward(broken) == 4.0 and not broken.resolved
    assert episode_reward(VerifierReport(), "fraction") == 0.0


def test_process_rewards() -> None:
    turns = checkpoint_turns(10, 3)
    assert turns == [2, 5, 8, 9]
    rewards = process_rewards(list(zip(turns, [1, 1, 4, 3], strict=True)), 10, baseline=1)
    assert rewards == [0, 0, 0, 0, 0, 0, 0, 0, 3, -1]
    assert sum(rewards) == 3 - 1  # final count minus the untouched baseline
    with pytest.raises(ValueError, match="must increase"):
        process_rewards([(3, 1), (3, 2)], 5)
    with pytest.raises(ValueError, match="outside"):
        process_rewards([(5, 1)], 5)
    assert checkpoint_turns(0, 4) == [] and checkpoint_turns(4, 4) == [3]


def test_multi_step_combination(tmp_path) -> None:
    v = VerifierSpec(kind=VerifierKind.TEST_SH, tests_dir=tmp_path, timeout_sec=1)
    a, b, c = (StepSpec(name=n, instruction="", verifier=v, min_reward=(("reward", 1.0),)) for n in "abc")
    ra, rb = _report(2, 0, reward=1.0), _report(1, 1, reward=0.5)
    assert passes_gate(ra, a.min_reward) and not passes_gate(rb, b.min_reward)
    assert passes_gate(VerifierReport(reward_values=(("reward", 1.0), ("safety", 0.0))), (("reward", 1.0),))
    assert not passes_gate(VerifierReport(reward_values=(("reward", 1.0), ("safety", 0.0))), (("safety", 1.0),))
    mean = combine_steps([(a, ra), (b, rb)], MultiStepStrategy.MEAN, 3)
    assert mean.reward == pytest.approx(0.5) and mean.failure_mode is FailureMode.STEP_GATE
    assert [t.name for t in mean.tests] == ["a/p0", "a/p1", "b/p0", "b/f0"] and mean.passed == 3
    final = combine_steps([(a, ra), (b, rb), (c, ra)], MultiStepStrategy.FINAL, 3)
    assert final.reward == 1.0 and final.failure_mode is FailureMode.NONE and not final.resolved
    assert combine_steps([(a, ra), (b, ra)], MultiStepStrategy.FINAL, 2).resolved


def test_failures_carry_the_first_assertion_line_and_why() -> None:
    out = ("============================= test session starts ==============================\n"
           "=========================== short test summary info ============================\n"
           "PASSED tests/test_a.py::test_ok\n"
           "FAILED tests/test_a.py::test_file - AssertionError: File /app/hello.txt does not exist\n"
           "ERROR tests/test_a.py::test_fixture - FileNotFoundError: /data\n"
           "========================= 1 failed, 1 passed, 1 error in 0.10s =========================\n")
    tests = parse_pytest_output(out)
    assert tests is not None and [t.message for t in tests] == [
        "", "AssertionError: File /app/hello.txt does not exist", "FileNotFoundError: /data"]
    report = VerifierReport(tests=tests, output_tail=out)
    assert report.why == ("2 of 3 tests failed: tests/test_a.py::test_file (AssertionError: File /app/hello.txt "
                          "does not exist); tests/test_a.py::test_fixture (FileNotFoundError: /data)")
    ctrf = parse_ctrf(json.dumps({"results": {"tests": [
        {"name": "t::a", "status": "failed", "message": "assert 1 == 2\n where 1 = f()"},
        {"name": "t::b", "status": "passed"}]}}))
    assert ctrf is not None and ctrf[0].message == "assert 1 == 2" and ctrf[1].message == ""
    junit = parse_junit('<testsuite><testcase classname="c" name="x"><failure message="boom">trace</failure>'
                        '</testcase></testsuite>')
    assert junit == (TestResult("c::x", TestStatus.FAILED, "boom"),)
    assert VerifierReport(reward_values=(("reward", 0.0),), output_tail="setup\ncurl: (6) Could not resolve\n").why \
        == "reward 0; output ends: curl: (6) Could not resolve"
    crashed = VerifierReport(failure_mode=FailureMode.VERIFIER_CRASHED, detail="tests/test.sh exited 3",
                             output_tail="about to crash\n")
    assert crashed.why == "verifier_crashed: tests/test.sh exited 3; output ends: about to crash"
    assert VerifierReport(tests=(TestResult("a", TestStatus.PASSED),)).why == ""
