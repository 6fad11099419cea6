"""Read task folders with Harbor's own task model and print what it makes of each, one JSON object a line.

Runs in Harbor's virtual environment (tests/tasks/harbor_reference/run.sh builds it), never in T1's:
`python dump.py DIR...`. For each folder: Harbor's Task (name, instruction with canary lines stripped),
its TaskConfig as JSON, and the verifier environment Harbor resolves for the task and for each step
(None where the verifier shares the agent's environment), or the error Harbor raised.
"""

import json
import sys
from pathlib import Path

from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import resolve_verifier_environment_definition


def _verifier_env(task: Task, step: object | None) -> dict[str, object] | None:
    found = resolve_verifier_environment_definition(task.config, task.paths, step)
    if found is None:
        return None
    return {"directory": str(found.directory.relative_to(task.paths.task_dir)),
            "docker_image": found.config.docker_image, "config": found.config.model_dump(mode="json")}


def dump(folder: Path) -> dict[str, object]:
    try:
        task = Task(folder)
    except Exception as exc:  # the reference's verdict on a folder it cannot read is part of the answer
        return {"path": str(folder), "error": f"{type(exc).__name__}: {exc}"}
    steps = task.config.steps or []
    return {"path": str(folder), "name": task.name, "instruction": task.instruction,
            "config": task.config.model_dump(mode="json"), "verifier_env": _verifier_env(task, None),
            "step_verifier_env": {s.name: _verifier_env(task, s) for s in steps}}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(dump(Path(arg))))
