"""VerifierReport and the parsers that fill it: pytest -rA output, CTRF JSON, JUnit XML, reward files.

Parsers are pure: text in, values out. A verifier that did not produce readable
results yields a report with a FailureMode saying why, never an exception.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from enum import StrEnum

from t1.errors import DataError


class TestStatus(StrEnum):
    """How one test case ended."""

    __test__ = False  # not a pytest class
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAIL = "xfail"
    XPASS = "xpass"


class FailureMode(StrEnum):
    """Why a verifier run did not give a clean result (NONE: it did; tests may still have failed)."""

    NONE = "none"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_CRASHED = "verifier_crashed"  # non-zero exit and no test results or reward
    REWARD_FILE_MISSING = "reward_file_missing"
    REWARD_FILE_INVALID = "reward_file_invalid"
    UNPARSABLE_OUTPUT = "unparsable_output"
    NO_TESTS = "no_tests"
    SETUP_FAILED = "setup_failed"
    NEEDS_IMAGE = "needs_image"
    NEEDS_NETWORK = "needs_network"
    NEEDS_FEATURE = "needs_feature"
    STEP_GATE = "step_gate"  # a multi-step task stopped: a step fell below its min_reward
    INFRA_ERROR = "infra_error"
    # The attempt's own failures (scored 0 and counted, never infra errors; see t1.tasks.verify.outcome):
    VERIFIER_TAMPERED = "verifier_tampered"  # results naming tests the task does not declare, or more than it has
    AGENT_BROKE_VERIFIER = "agent_broke_verifier"  # the verifier could not be set up after the agent acted
    SANDBOX_DIED = "sandbox_died"  # the sandbox or its connection was lost after the agent acted
    SANDBOX_AT_LIMIT = "sandbox_at_limit"  # processes, memory or disk of the sandbox exhausted after the agent acted


ATTEMPT_FAILURES = frozenset({FailureMode.VERIFIER_TAMPERED, FailureMode.AGENT_BROKE_VERIFIER,
                              FailureMode.SANDBOX_DIED, FailureMode.SANDBOX_AT_LIMIT})
"""Failure modes that are the attempt's doing: reward 0 in every mode, counted in every statistic."""


_PASSING = (TestStatus.PASSED, TestStatus.XFAIL)


@dataclass(frozen=True, slots=True)
class TestResult:
    """One verifier (test case) and how it ended."""

    __test__ = False  # not a pytest class
    name: str
    status: TestStatus
    message: str = ""  # for a failure: the first line of its assertion or error

    @property
    def failed(self) -> bool:
        return self.status in (TestStatus.FAILED, TestStatus.ERROR, TestStatus.XPASS)


@dataclass(frozen=True, slots=True)
class VerifierReport:
    """What one verifier run found: per-test status, reward file values, timing and failure mode."""

    tests: tuple[TestResult, ...] = ()
    reward_values: tuple[tuple[str, float], ...] = ()
    duration_s: float = 0.0
    timed_out: bool = False
    exit_code: int | None = None
    failure_mode: FailureMode = FailureMode.NONE
    detail: str = ""
    output_tail: str = ""
    shims_used: tuple[str, ...] = ()
    steps: tuple[tuple[str, VerifierReport], ...] = field(default=())

    @property
    def checks(self) -> tuple[tuple[str, float], ...]:
        """reward.json entries read as one check each (1 passes): a file of named values with no `reward` key
        and no test report beside it (the curriculum's bash verifiers write one entry per check)."""
        if self.tests or not self.reward_values or self.reward is not None:
            return ()
        return self.reward_values

    @property
    def passed(self) -> int:
        if self.tests:
            return sum(t.status in _PASSING for t in self.tests)
        if checks := self.checks:
            return sum(v >= 1.0 for _, v in checks)
        reward = self.reward
        return 1 if reward is not None and reward >= 1.0 else 0

    @property
    def failed(self) -> int:
        return sum(t.status in (TestStatus.FAILED, TestStatus.XPASS) for t in self.tests)

    @property
    def errors(self) -> int:
        return sum(t.status is TestStatus.ERROR for t in self.tests)

    @property
    def total(self) -> int:
        if self.tests:
            return sum(t.status is not TestStatus.SKIPPED for t in self.tests)
        if checks := self.checks:
            return len(checks)
        return 1 if self.reward_values else 0

    @property
    def reward(self) -> float | None:
        """The reward file's `reward` value (reward.txt, or reward.json's 'reward' key), if any."""
        return dict(self.reward_values).get("reward")

    @property
    def failed_tests(self) -> tuple[TestResult, ...]:
        return tuple(t for t in self.tests if t.failed)

    @property
    def why(self) -> str:
        """One line saying why the run is not resolved: the failure mode, the failing tests with the first line
        of each assertion, or the reward and the end of the verifier's output; '' when resolved."""
        if self.resolved:
            return ""
        if self.failure_mode not in (FailureMode.NONE, FailureMode.STEP_GATE):
            return f"{self.failure_mode}: {self.detail}" + (f"; output ends: {_last_line(self.output_tail)}"
                                                             if self.output_tail.strip() else "")
        failed = self.failed_tests
        if failed:
            shown = "; ".join(f"{t.name}" + (f" ({t.message})" if t.message else "") for t in failed[:5])
            more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
            return f"{len(failed)} of {self.total} tests failed: {shown}{more}"
        if failed_checks := [k for k, v in self.checks if v < 1.0]:
            return f"{len(failed_checks)} of {self.total} checks failed: {', '.join(failed_checks[:5])}"
        if self.steps and self.failure_mode is FailureMode.STEP_GATE:
            name, step = self.steps[-1]
            return f"step {name} fell below its min_reward: {step.why}"
        reward = self.reward
        missing = _not_started(self.output_tail) if not self.tests else ""
        if reward is not None:
            return f"reward {reward:g}" + (f"; the verifier could not start {missing}" if missing else "") + (
                f"; output ends: {_last_line(self.output_tail)}" if self.output_tail.strip() else "")
        if missing:
            return f"the verifier could not start {missing}"
        return self.detail or "no test passed"

    @property
    def resolved(self) -> bool:
        """The benchmark metric: a clean run, every verifier passes, and any reward file says 1."""
        if self.failure_mode is not FailureMode.NONE or self.total == 0:
            return False
        reward = self.reward
        return self.passed == self.total and (reward is None or reward >= 1.0)


_NOT_FOUND = re.compile(r"(?:^|: )([\w.+-]+): (?:command not found|No such file or directory)\s*$", re.M)


def _not_started(output: str) -> str:
    """`uvx (command not found)` when the output says a program the verifier ran was not there (pure)."""
    found = _NOT_FOUND.findall(output)
    return f"{found[0]} (command not found)" if found else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:240] if lines else ""


_SECTION = re.compile(r"^_{3,} (?:ERROR at \w+ of |(ERROR collecting ))?(\S+) _{3,}\s*$")
"""A test's block under FAILURES / ERRORS, or a module's that pytest could not collect."""
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+\s*$")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(.*)$")
_FINAL_LINE = re.compile(r"^=+ .*\b(passed|failed|error|errors|skipped|no tests ran)\b.* in [\d.]+s.*=+\s*$")


def _first_error_lines(text: str) -> dict[str, str]:
    """Test block header ('test_a', 'TestB.test_b', 'test_c[1]') -> its first `E   ` line, from FAILURES/ERRORS;
    a module pytest could not collect ('tests/test_x.py') -> its last one (the exception, after its traceback)."""
    firsts: dict[str, str] = {}
    current, collecting = "", False
    for raw in text.splitlines():
        m = _SECTION.match(raw)
        if m:
            current, collecting = m.group(2), bool(m.group(1))
            continue
        if current and (collecting or current not in firsts) and raw.startswith("E   "):
            firsts[current] = raw[4:].strip()
    return firsts


def _full_message(nodeid: str, short: str, firsts: dict[str, str]) -> str:
    """The summary line's message unless pytest cut it to the terminal width ('...'), then the E line."""
    if short and not short.endswith("..."):
        return short
    key = nodeid.split("::", 1)[-1].replace("::", ".")
    if key not in firsts and "::" not in nodeid:  # a module: the summary names it from the cwd, its block from rootdir
        key = next((k for k in firsts if nodeid.endswith(f"/{k}")), key)
    return firsts.get(key, short)


def parse_pytest_output(text: str) -> tuple[TestResult, ...] | None:
    """Per-test results from pytest `-rA` output; None when the output has no readable summary."""
    results: dict[str, tuple[TestStatus, str]] = {}
    in_summary = False
    saw_final = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if _SUMMARY_HEADER.match(line):
            in_summary = True
            continue
        if _FINAL_LINE.match(line):
            saw_final = True
            in_summary = False
            continue
        if not in_summary:
            continue
        m = _SUMMARY_LINE.match(line)
        if not m:
            continue
        status = TestStatus(m.group(1).lower())
        rest = m.group(2)
        if status is TestStatus.SKIPPED:
            rest = re.sub(r"^\[\d+\]\s*", "", rest)
        name, _, message = rest.partition(" - ")
        if name.strip():
            results[name.strip()] = (status, message.strip() if status in (TestStatus.FAILED, TestStatus.ERROR)
                                     else "")
    if not results and not saw_final:
        return None
    bad = (TestStatus.FAILED, TestStatus.ERROR)
    firsts = _first_error_lines(text) if any(st in bad for st, _ in results.values()) else {}
    return tuple(TestResult(n, st, _full_message(n, m, firsts)[:240] if st in bad else "")
                 for n, (st, m) in results.items())


_CTRF_STATUS = {"passed": TestStatus.PASSED, "failed": TestStatus.FAILED, "skipped": TestStatus.SKIPPED,
                "pending": TestStatus.SKIPPED, "other": TestStatus.ERROR}


def parse_ctrf(text: str) -> tuple[TestResult, ...] | None:
    """Per-test results from a CTRF JSON report (results.tests[].name/status); None if unreadable."""
    try:
        tests = json.loads(text)["results"]["tests"]
        return tuple(TestResult(str(t["name"]), _CTRF_STATUS.get(str(t["status"]), TestStatus.ERROR),
                                _first_line(t.get("message")))
                     for t in tests)
    except (ValueError, KeyError, TypeError):
        return None


def _first_line(message: object) -> str:
    text = str(message or "").strip()
    return text.splitlines()[0][:240] if text else ""


def parse_junit(text: str) -> tuple[TestResult, ...] | None:
    """Per-test results from JUnit XML (<testcase> with <failure>/<error>/<skipped>); None if unreadable."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    results = []
    for case in root.iter("testcase"):
        name = "::".join(p for p in (case.get("classname", ""), case.get("name", "")) if p)
        error, failure = case.find("error"), case.find("failure")
        bad = error if error is not None else failure
        if error is not None:
            status = TestStatus.ERROR
        elif failure is not None:
            status = TestStatus.FAILED
        elif case.find("skipped") is not None:
            status = TestStatus.SKIPPED
        else:
            status = TestStatus.PASSED
        message = _first_line(bad.get("message") or bad.text) if bad is not None else ""
        results.append(TestResult(name, status, message))
    return tuple(results)


class RewardFileError(DataError, ValueError):
    """A reward file that exists but does not hold a number (reward.txt) or a table of numbers (reward.json)."""


def parse_reward_txt(text: str) -> tuple[tuple[str, float], ...]:
    try:
        value = float(text.strip())
    except ValueError:
        raise RewardFileError(f"reward.txt holds {text.strip()[:80]!r}, not a number") from None
    if not math.isfinite(value):
        raise RewardFileError(f"reward.txt holds {value}, not a finite number")
    return (("reward", value),)


def parse_reward_json(text: str) -> tuple[tuple[str, float], ...]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RewardFileError(f"reward.json is not JSON ({exc})") from None
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        data = {"reward": data}
    if not isinstance(data, dict):
        raise RewardFileError("reward.json must be an object of name -> number")
    out = []
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RewardFileError(f"reward.json key {k!r} is {v!r}, not a finite number")
        out.append((str(k), float(v)))
    return tuple(sorted(out))
