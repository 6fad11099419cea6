"""Harbor's Terminus-2, unmodified, run inside the sandbox it works in (installed beside Harbor by
scripts/harnesses.sh; run with Harbor's own Python 3.12).

Harbor runs an agent against an environment it reaches from outside (a container's exec). Inside a T1
sandbox the environment is the machine itself, so this driver hands Terminus-2 the smallest
environment it uses (exec, upload_file, download_file) over local processes, and runs the agent
with its model behind the episode's gateway (OPENAI_BASE_URL, OPENAI_API_KEY). The agent's code is
Harbor's as released; nothing of T1 is imported here.

    python3.12 terminus2_local.py [--max-turns N] [--parser json|xml]   (the task in $T1_INSTRUCTION_FILE)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import ExecResult
from harbor.models.agent.context import AgentContext


class LocalEnvironment:
    """The sandbox as the environment Terminus-2 drives: commands are this machine's processes."""

    def __init__(self, logs_dir: Path) -> None:
        self.session_id = "t1-local"
        self.default_user = None
        self.trial_paths = type("TrialPaths", (), {"agent_dir": logs_dir})()

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=cwd, env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"), return_code=124)
        return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                          return_code=proc.returncode or 0)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target_path)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target_path)


async def main_async(args: argparse.Namespace) -> int:
    instruction = Path(os.environ["T1_INSTRUCTION_FILE"]).read_text()
    logs = Path(args.logs_dir)
    logs.mkdir(parents=True, exist_ok=True)
    env = LocalEnvironment(logs)
    agent = Terminus2(logs_dir=logs, model_name=f"openai/{os.environ['T1_MODEL']}",
                      api_base=os.environ["OPENAI_BASE_URL"], max_turns=args.max_turns, parser_name=args.parser,
                      enable_summarize=False, record_terminal_session=False, suppress_max_turns_warning=True,
                      model_info={"max_input_tokens": args.context_tokens, "max_output_tokens": 4096,
                                  "input_cost_per_token": 0.0, "output_cost_per_token": 0.0})
    await agent.setup(env)  # type: ignore[arg-type]
    context = AgentContext()
    await agent.run(instruction, env, context)  # type: ignore[arg-type]
    print(f"terminus-2 done: {context.model_dump_json(exclude_none=True)[:2000]}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-turns", type=int, default=50)
    p.add_argument("--parser", choices=("json", "xml"), default="json")
    p.add_argument("--context-tokens", type=int, default=32768)
    p.add_argument("--logs-dir", default="/logs/agent/terminus-2")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
