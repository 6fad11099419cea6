"""`t1 tasks validate`: parse a task folder and predict, before running it, whether it will run on this host.

A check is one of four outcomes, each with what it found:
- ok: it parses and nothing predicted stops it (notes may still say what T1 does
  differently, e.g. Dockerfile lines it skips or task.toml keys outside the schema);
- will_not_run: a needs_* reason (t1.tasks.needs.predict: the image line, the packages, the
  field), the same sentence a run would refuse with;
- incomplete: it would run, but a phase has no reference solution (oracle cannot);
- malformed: it does not parse (the error names the file and the field), or a test file of its
  does not compile under the sandbox's python3 (the error names the file, line and cause).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from t1.sandbox.needs import Need
from t1.sandbox.types import LOCAL_TRAITS, SandboxTraits
from t1.tasks.image.dockerplan import plan_or_none
from t1.tasks.needs.predict import package_needs, static_needs
from t1.tasks.needs.test_imports import uncollectable
from t1.tasks.spec import TaskParseError, TaskSpec


class CheckStatus(StrEnum):
    OK = "ok"
    WILL_NOT_RUN = "will_not_run"
    INCOMPLETE = "incomplete"
    MALFORMED = "malformed"


EXIT_CODES = {CheckStatus.OK: 0, CheckStatus.WILL_NOT_RUN: 1, CheckStatus.INCOMPLETE: 1, CheckStatus.MALFORMED: 2}


@dataclass(frozen=True, slots=True)
class TaskCheck:
    """What validate found for one task folder."""

    path: str
    status: CheckStatus
    task: str = ""
    format: str = ""
    steps: int = 0
    needs: tuple[Need, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "task": self.task, "status": str(self.status), "format": self.format,
                "steps": self.steps, "exit_code": EXIT_CODES[self.status],
                "needs": [{"kind": str(n.kind), "what": n.what} for n in self.needs],
                "problems": list(self.problems), "notes": list(self.notes), "error": self.error}


def _notes(spec: TaskSpec) -> list[str]:
    notes = [f"task file key outside the format's schema, ignored: {k}" for k in spec.ignored_fields]
    env = spec.environment
    plan = plan_or_none(env.dockerfile)
    if plan is not None:
        notes += [f"Dockerfile {s} has no effect in a sandbox, skipped" for s in plan.skipped]
    if env.skills_dir:
        notes.append(f"environment.skills_dir {env.skills_dir}: the files stay there; T1's agents load no skills")
    return notes


def check_task(spec: TaskSpec, path: str, *, traits: SandboxTraits = LOCAL_TRAITS) -> TaskCheck:
    """Predict what will stop a parsed task in sandboxes of `traits` (see the module docstring)."""
    needs = tuple(dict.fromkeys([*static_needs(spec, traits=traits), *package_needs(spec)]))
    problems = tuple(f"{p.name}: no reference solution (solution/solve.sh or solution.sh)"
                     for p in spec.phases() if p.solution is None)
    broken = uncollectable(spec) if traits.no_images else ""
    status = CheckStatus.MALFORMED if broken else CheckStatus.WILL_NOT_RUN if needs else \
        CheckStatus.INCOMPLETE if problems else CheckStatus.OK
    return TaskCheck(path=path, status=status, task=spec.id, format=str(spec.format), steps=len(spec.phases()),
                     needs=needs, problems=problems, notes=tuple(_notes(spec)), error=broken)


def check_folder(path: Path, *, traits: SandboxTraits = LOCAL_TRAITS) -> TaskCheck:
    """Load and check one task folder; a parse error is a malformed check, not an exception."""
    from t1.tasks.formats.dataset import load_task

    try:
        spec = load_task(path)
    except TaskParseError as exc:
        return TaskCheck(path=str(path), status=CheckStatus.MALFORMED, error=str(exc))
    return check_task(spec, str(path), traits=traits)

