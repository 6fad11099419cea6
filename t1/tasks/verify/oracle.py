"""Run a task without a model: the reference solution then the verifiers (oracle), or the verifiers alone (verify).

`oracle` shows that a task is solvable and its verifiers accept the solution;
`verify` on an untouched sandbox shows that they reject doing nothing (a task
whose verifiers pass without work is flagged). Each task gets a fresh sandbox,
destroyed afterwards. Multi-step tasks run step by step in the same sandbox and
stop at a step that falls below its min_reward. Verifiers run in a verifier shell
(`ShellRole.VERIFIER`), which sees the solution's processes (a server it started)
but is out of their reach. Setup failures and lost sandboxes become a status, so
one bad task does not stop a batch; once the solution has run they are its own
failure (`t1.tasks.verify.outcome`), scored 0, never infra_error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from t1.sandbox.needs import NeedKind, NeedsError, NeedsNetworkError
from t1.sandbox.types import Sandbox, SandboxLost, SandboxProvider, Shell, ShellRole
from t1.tasks.provision import Provisioned, as_user, enter_step, provision, sandbox_request
from t1.tasks.spec import SolutionSpec, StepSpec, TaskSpec
from t1.tasks.toolchain import (
    STAND_INS_DIR,
    install_stand_ins,
    needs_network_lines,
    toolchain_prefix,
)
from t1.tasks.transfer import SetupError, one_line_cause, upload_dir_contents
from t1.tasks.verify.outcome import SANDBOX_FAULTS, attempt_failure
from t1.tasks.verify.report import FailureMode, VerifierReport
from t1.tasks.verify.rewards import RewardMode, combine_steps, episode_reward, passes_gate
from t1.tasks.verify.separate import (
    VerifierEnvironmentError,
    fresh_sandbox,
    packed_artifacts,
    run_separate_verifier,
)
from t1.tasks.verify.verifier import run_verifier

log = logging.getLogger(__name__)
OUTPUT_TAIL_CHARS = 2000  # of verifier and setup output kept in reports
SOLUTION_DIRS = ("/solution", "/tmp/solution")  # /solution as in a container; /tmp where the root is read-only


class RunMode(StrEnum):
    ORACLE = "oracle"
    VERIFY = "verify"


class RunStatus(StrEnum):
    OK = "ok"
    SOLUTION_FAILED = "solution_failed"  # the oracle script exited non-zero or timed out
    PASSES_WITHOUT_WORK = "passes_without_work"  # verify: resolved on an untouched sandbox
    VERIFIER_ERROR = "verifier_error"
    SETUP_FAILED = "setup_failed"
    NEEDS_IMAGE = "needs_image"  # the environment needs a container image (t1.sandbox.needs names the line)
    NEEDS_NETWORK = "needs_network"  # setup needs packages or downloads this offline host lacks
    NEEDS_FEATURE = "needs_feature"  # a task.toml feature T1 does not provide (GPUs, MCP servers, ...)
    NO_SOLUTION = "no_solution"
    INFRA_ERROR = "infra_error"


@dataclass(frozen=True, slots=True)
class TaskRun:
    """The outcome of running one task in oracle or verify mode."""

    task: str
    mode: RunMode
    status: RunStatus
    report: VerifierReport
    reward: float
    detail: str = ""
    setup_output: str = ""  # the end of a failed setup command's output

    @property
    def resolved(self) -> bool:
        return self.report.resolved

    @property
    def why(self) -> str:
        """One line: why the task was refused or failed at setup, or why its verifiers did not resolve."""
        if self.status is RunStatus.PASSES_WITHOUT_WORK:
            return "the verifiers pass on an untouched sandbox"
        if self.detail and self.status is not RunStatus.OK:
            return f"{self.status}: {self.detail}"
        return self.report.why

    def as_json(self) -> dict[str, object]:
        return {"task": self.task, "resolved": self.resolved, "reward": self.reward, "passed": self.report.passed,
                "total": self.report.total, "status": str(self.status), "failure_mode": str(self.report.failure_mode),
                "why": self.why, "detail": self.detail or self.report.detail,
                "failed_tests": [{"name": t.name, "message": t.message} for t in self.report.failed_tests],
                "verifier_output_tail": self.report.output_tail[-OUTPUT_TAIL_CHARS:],
                "setup_output_tail": self.setup_output[-OUTPUT_TAIL_CHARS:],
                "shims_used": list(self.report.shims_used)}


async def run_solution(shell: Shell, solution: SolutionSpec, provisioned: Provisioned, timeout_s: float, *,
                       offline: bool = False) -> str:
    """Upload and run a reference solution; returns '' on success, else why it failed.

    Offline, the solution gets the installer stand-ins (as setup does), so its `pip install` of a package the
    host has succeeds, and one it lacks is a NeedsNetworkError naming it.
    """
    probe = await shell.run(f"for d in {' '.join(SOLUTION_DIRS)}; do rm -rf $d 2>/dev/null; "
                            "mkdir -p $d 2>/dev/null && [ -w $d ] && echo $d && break; done", 60)
    if not probe.output.strip():
        raise SetupError(f"cannot create a solution folder (tried {', '.join(SOLUTION_DIRS)})")
    sol_dir = probe.output.strip().splitlines()[-1]
    env = "".join(f"export {k}={shlex.quote(v)}; " for k, v in solution.env)
    if solution.commands:
        script = "\n".join(solution.commands) + "\n"
        await shell.write_file(f"{sol_dir}/solution.sh", script.encode(), 0o755)
        command = f"bash {sol_dir}/solution.sh"
    elif solution.files_dir is not None:
        await upload_dir_contents(shell, solution.files_dir, sol_dir)
        command = f"bash {sol_dir}/{solution.script.name}"
    else:
        await shell.write_file(f"{sol_dir}/{solution.script.name}", solution.script.read_bytes(), 0o755)
        command = f"bash {sol_dir}/{solution.script.name}"
    stand_ins = ""
    if offline:
        await install_stand_ins(shell)
        stand_ins = toolchain_prefix(STAND_INS_DIR)
    inner = f"{provisioned.prefix()}{env}{stand_ins}{command}"  # the stand-ins first, whatever PATH the task sets
    result = await shell.run(f"( {as_user(inner, provisioned.user)} ) < /dev/null 2>&1", timeout_s=timeout_s)
    if result.timed_out:
        return f"solution timed out after {timeout_s:.0f}s"
    if result.exit_code != 0:
        needs = needs_network_lines(result.output)
        if needs:  # the reference solution installs packages this offline host lacks
            raise NeedsNetworkError(f"solution: {'; '.join(needs)}")
        return f"solution exited {result.exit_code}: {one_line_cause(result.output)}"
    return ""


async def _verify(provider: SandboxProvider, sandbox: Sandbox, shell: Shell, spec: TaskSpec, phase: StepSpec,
                  provisioned: Provisioned, offline: bool) -> VerifierReport:
    if phase.verifier.separate is not None:
        async with packed_artifacts(shell, phase.verifier.separate, provisioned) as artifacts:
            return await run_separate_verifier(fresh_sandbox(provider), spec, phase.verifier, artifacts,
                                               traits=provider.traits, offline=offline)
    verifier_shell = await sandbox.open_shell(role=ShellRole.VERIFIER)
    try:
        return await run_verifier(verifier_shell, phase.verifier, provisioned, offline=offline)
    finally:
        with contextlib.suppress(*SANDBOX_FAULTS):
            await verifier_shell.close()


class _AfterSolution(Exception):
    """A sandbox fault once the solution had run: the attempt's own failure, not the infrastructure's."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _run_phases(provider: SandboxProvider, sandbox: Sandbox, spec: TaskSpec, mode: RunMode
                      ) -> tuple[VerifierReport, str]:
    shell = await sandbox.open_shell()
    acted = False
    try:
        provisioned = await provision(shell, spec, provider.traits)
        await sandbox.end_setup()  # the verifier runs the system as setup left it, whatever the solution writes
        offline = provider.traits.offline or not spec.environment.allow_internet
        done: list[tuple[StepSpec, VerifierReport]] = []
        solution_problem = ""
        phases = spec.phases()
        for phase in phases:
            if spec.is_multi_step:
                await enter_step(shell, phase, provisioned)
            if mode is RunMode.ORACLE and phase.solution is not None:
                acted = True
                problem = await run_solution(shell, phase.solution, provisioned,
                                             phase.agent_timeout_sec or spec.agent_timeout_sec, offline=offline)
                solution_problem = solution_problem or (f"{phase.name}: {problem}" if problem else "")
            report = await _verify(provider, sandbox, shell, spec, phase, provisioned, offline)
            done.append((phase, report))
            if not passes_gate(report, phase.min_reward):
                break
        if not spec.is_multi_step:
            return done[0][1], solution_problem
        return combine_steps(done, spec.multi_step_strategy, len(phases)), solution_problem
    except Exception as exc:
        if attempt_failure(exc, acted) is not None:
            raise _AfterSolution(exc) from exc
        raise
    finally:
        with contextlib.suppress(*SANDBOX_FAULTS):
            await shell.close()


_NEED_STATUS = {NeedKind.IMAGE: RunStatus.NEEDS_IMAGE, NeedKind.NETWORK: RunStatus.NEEDS_NETWORK,
                NeedKind.FEATURE: RunStatus.NEEDS_FEATURE}


def _status(mode: RunMode, spec: TaskSpec, report: VerifierReport, solution_problem: str) -> RunStatus:
    if report.failure_mode not in (FailureMode.NONE, FailureMode.STEP_GATE):
        return RunStatus.VERIFIER_ERROR
    if mode is RunMode.VERIFY:
        return RunStatus.PASSES_WITHOUT_WORK if report.resolved else RunStatus.OK
    if solution_problem:
        return RunStatus.SOLUTION_FAILED
    if any(p.solution is None for p in spec.phases()):
        return RunStatus.NO_SOLUTION
    return RunStatus.OK


async def run_task(
    provider: SandboxProvider, spec: TaskSpec, mode: RunMode, *, reward_mode: RewardMode = RewardMode.COUNT,
) -> TaskRun:
    """Run one task in a fresh sandbox (oracle: solution then verifiers; verify: verifiers only), set up as the
    provider's traits say."""
    status: RunStatus | None = None
    detail = setup_output = ""
    report = VerifierReport()
    try:
        sandbox = await provider.create(sandbox_request(spec))
    except SandboxLost as exc:
        log.warning("task %s: sandbox create failed: %s", spec.id, exc)
        return TaskRun(spec.id, mode, RunStatus.INFRA_ERROR, VerifierReport(failure_mode=FailureMode.INFRA_ERROR),
                       0.0, str(exc))
    except NeedsError as exc:  # the provider cannot give what the task asks (its image, the internet)
        return TaskRun(spec.id, mode, _NEED_STATUS[exc.kind], VerifierReport(failure_mode=FailureMode(str(exc.kind))),
                       0.0, str(exc))
    except SetupError as exc:  # the provider could not make the task's environment (a failed image build)
        return TaskRun(spec.id, mode, RunStatus.SETUP_FAILED, VerifierReport(failure_mode=FailureMode.SETUP_FAILED),
                       0.0, f"task {spec.id}: {exc}", exc.output_tail)
    except Exception as exc:  # anything else the provider raised: this task's infra error, not the batch's end
        log.exception("task %s: sandbox create crashed", spec.id)
        return TaskRun(spec.id, mode, RunStatus.INFRA_ERROR, VerifierReport(failure_mode=FailureMode.INFRA_ERROR),
                       0.0, f"crash:{type(exc).__name__}: {exc}")
    try:
        report, detail = await _run_phases(provider, sandbox, spec, mode)
    except _AfterSolution as exc:
        failure = attempt_failure(exc.cause, agent_acted=True) or FailureMode.SANDBOX_DIED
        status, detail, report = (
            RunStatus.VERIFIER_ERROR,
            str(exc),
            VerifierReport(failure_mode=failure, detail=str(exc)),
        )
    except NeedsError as exc:
        status, detail = _NEED_STATUS[exc.kind], str(exc)
        report = VerifierReport(failure_mode=FailureMode(str(exc.kind)))
    except (SetupError, VerifierEnvironmentError) as exc:  # the task's environment (or its verifier's) did not build
        status, detail, report = RunStatus.SETUP_FAILED, str(exc), VerifierReport(failure_mode=FailureMode.SETUP_FAILED)
        setup_output = exc.output_tail
    except SandboxLost as exc:
        log.warning("task %s: sandbox lost: %s", spec.id, exc)
        status, detail, report = RunStatus.INFRA_ERROR, str(exc), VerifierReport(failure_mode=FailureMode.INFRA_ERROR)
    except Exception as exc:  # T1's own fault in one task: that task's infra error, never the end of a batch
        log.exception("task %s: crashed", spec.id)
        status, detail = RunStatus.INFRA_ERROR, f"crash:{type(exc).__name__}: {exc}"
        report = VerifierReport(failure_mode=FailureMode.INFRA_ERROR)
    finally:
        await provider.destroy(sandbox)
    needs = [] if status is not None or report.resolved else needs_network_lines(report.output_tail)
    if needs:  # the tests install packages this offline host lacks: the run says nothing about the task
        status, detail = RunStatus.NEEDS_NETWORK, f"verifier: {'; '.join(needs)}"
    elif status is None:
        status = _status(mode, spec, report, detail)
    return TaskRun(spec.id, mode, status, report, episode_reward(report, reward_mode), detail, setup_output)


async def run_tasks(
    provider: SandboxProvider, specs: Sequence[TaskSpec], mode: RunMode, *, concurrency: int = 2,
    reward_mode: RewardMode = RewardMode.COUNT,
    on_result: Callable[[TaskRun], None] | None = None,
) -> list[TaskRun]:
    """Run many tasks, at most `concurrency` at a time; `on_result` sees each as it finishes; returns input order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: TaskSpec) -> TaskRun:
        async with gate:
            run = await run_task(provider, spec, mode, reward_mode=reward_mode)
        if on_result is not None:
            on_result(run)
        return run

    async with asyncio.TaskGroup() as tg:
        futures = [tg.create_task(one(s)) for s in specs]
    return [f.result() for f in futures]
