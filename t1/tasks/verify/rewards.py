"""Rewards from verifier reports, as pure functions.

- count (training default): the absolute number of passing verifiers.
- fraction: passing / total.
- binary: 1 when resolved (all pass, clean run), the benchmark's metric.
- process rewards: verifiers run every K turns; each checkpoint turn is rewarded
  with the increase in passing verifiers since the previous checkpoint, so the
  per-turn rewards of an episode sum to its final count reward (minus the count
  an untouched sandbox already had).
A report whose failure is the attempt's own (a tampered verifier, a broken or dead sandbox:
`t1.tasks.verify.report.ATTEMPT_FAILURES`) is worth 0 in every mode; the count reward is bounded by the
tests the task declares because a report passing more than that is a tampered one
(`t1.tasks.verify.declared`).
Multi-step tasks combine per-step rewards by Harbor's strategy (mean or final)
and stop at a step whose reward falls below its min_reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from t1.tasks.spec import MultiStepStrategy, StepSpec
from t1.tasks.verify.report import ATTEMPT_FAILURES, FailureMode, TestResult, VerifierReport


class RewardMode(StrEnum):
    COUNT = "count"
    FRACTION = "fraction"
    BINARY = "binary"


def episode_reward(report: VerifierReport, mode: RewardMode | str = RewardMode.COUNT) -> float:
    """The scalar reward of one finished episode."""
    mode = RewardMode(mode)
    if report.failure_mode in ATTEMPT_FAILURES:
        return 0.0
    if mode is RewardMode.BINARY:
        return 1.0 if report.resolved else 0.0
    if mode is RewardMode.FRACTION:
        return report.passed / report.total if report.total else 0.0
    return float(report.passed)


def step_reward(report: VerifierReport) -> float:
    """A Harbor step's reward: the reward file's value, else the fraction of passing tests."""
    if report.failure_mode in ATTEMPT_FAILURES:
        return 0.0
    if report.reward is not None:
        return report.reward
    return report.passed / report.total if report.total else 0.0


def passes_gate(report: VerifierReport, min_reward: Sequence[tuple[str, float]]) -> bool:
    """Whether a step may be followed by the next: each named reward value reaches its minimum."""
    values = dict(report.reward_values)
    values.setdefault("reward", step_reward(report))
    return all(values.get(key, 0.0) >= threshold for key, threshold in min_reward)


def combine_steps(
    step_reports: Sequence[tuple[StepSpec, VerifierReport]], strategy: MultiStepStrategy, num_steps: int
) -> VerifierReport:
    """One report for a multi-step task: tests prefixed by step, reward by strategy (unrun steps count 0)."""
    tests = tuple(TestResult(f"{spec.name}/{t.name}", t.status) for spec, r in step_reports for t in r.tests)
    rewards = [step_reward(r) for _, r in step_reports]
    if strategy is MultiStepStrategy.FINAL:
        combined = rewards[-1] if len(rewards) == num_steps else 0.0
    else:
        combined = sum(rewards) / num_steps if num_steps else 0.0
    failure, detail = FailureMode.NONE, ""
    for spec, r in step_reports:
        if r.failure_mode is not FailureMode.NONE:
            failure, detail = r.failure_mode, f"step {spec.name}: {r.detail}"
            break
    if failure is FailureMode.NONE and len(step_reports) < num_steps:
        spec, _ = step_reports[-1]
        failure, detail = FailureMode.STEP_GATE, f"step {spec.name} fell below its min_reward"
    return VerifierReport(
        tests=tests,
        reward_values=(("reward", combined),),
        duration_s=sum(r.duration_s for _, r in step_reports),
        timed_out=any(r.timed_out for _, r in step_reports),
        failure_mode=failure,
        detail=detail,
        shims_used=tuple(sorted({s for _, r in step_reports for s in r.shims_used})),
        steps=tuple((spec.name, r) for spec, r in step_reports),
    )


def process_rewards(checkpoints: Sequence[tuple[int, int]], num_turns: int, baseline: int = 0) -> list[float]:
    """Per-turn rewards from (turn index, passing verifiers) checkpoints, in turn order.

    The turn at which a checkpoint was taken receives the change in passing
    verifiers since the previous checkpoint (or since `baseline`); other turns get 0.
    """
    rewards = [0.0] * num_turns
    previous, last_turn = baseline, -1
    for turn, passed in checkpoints:
        if not 0 <= turn < num_turns:
            raise ValueError(f"checkpoint turn {turn} is outside the episode's {num_turns} turns")
        if turn <= last_turn:
            raise ValueError(f"checkpoint turns must increase; got {turn} after {last_turn}")
        rewards[turn] += float(passed - previous)
        previous, last_turn = passed, turn
    return rewards


def checkpoint_turns(num_turns: int, every_k: int) -> list[int]:
    """The turns after which process-reward verifiers run: every K-th turn and the last one."""
    if every_k < 1:
        raise ValueError("every_k must be >= 1")
    turns = list(range(every_k - 1, num_turns, every_k))
    if num_turns and (not turns or turns[-1] != num_turns - 1):
        turns.append(num_turns - 1)
    return turns
