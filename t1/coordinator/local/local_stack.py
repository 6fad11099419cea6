"""The local stack of a one-command run: the model, the task sets, and child t1-inference / t1-trainer services.

What is configured remotely (inference.pool.endpoints, trainer.endpoint) is used as is; what
is not is started here as a child process with the coordinator's own config file and overrides,
and, unless a token is configured, a service token generated for this run (`t1.rpc.auth`).

`supervise()` watches the children while the run goes. An inference server that exits is
restarted on its port (at most MAX_RESTARTS times in a run; the pool brings it up to the current
weights before it serves); a trainer that exits ends the run with a `ChildFailed` naming it (its
buffer and optimizer state went with it: the run is resumed from its last checkpoint with
`t1-coordinator --resume`), as does an inference server past its restarts or one that fails to
come back.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

from t1.config.schema import T1Config
from t1.coordinator.local.children import Child, ChildFailed, service_argv
from t1.coordinator.model_setup import ensure_model
from t1.rpc.auth import SERVICE_TOKEN_ENV, resolve_token, use_service_token
from t1.tasks.formats.dataset import load_named_set
from t1.tasks.spec import TaskSpec

log = logging.getLogger(__name__)

CHILD_START_TIMEOUT_S = 600.0
MAX_RESTARTS = 3  # per inference child, over the run
SUPERVISE_EVERY_S = 0.5


class LocalStack:
    def __init__(self, cfg: T1Config, config_file: str | None, overrides: list[str], run_dir: Path) -> None:
        self.cfg = cfg
        self.config_file = config_file
        self.overrides = overrides
        self.run_dir = run_dir
        self.children: list[Child] = []
        self._stopping = False
        self.child_env: dict[str, str] = {}
        if resolve_token(cfg.auth) is None:  # children still require a token: one for this run
            token = secrets.token_urlsafe(32)
            self.child_env = {SERVICE_TOKEN_ENV: token}
            use_service_token(token)

    async def prepare(self) -> dict[str, list[TaskSpec]]:
        """Make the model if missing and load (synthesizing if configured) every task set in use."""
        await asyncio.to_thread(ensure_model, self.cfg)
        ws = self.cfg.trainer.warm_start
        extra = [*(ws.demo_sets or []), *([ws.sft_validation_set] if ws.sft_validation_set else [])]
        names = list(dict.fromkeys([*self.cfg.tasks.train, *self.cfg.tasks.eval, *extra]))
        sets = {}
        for name in names:
            sets[name] = await asyncio.to_thread(load_named_set, self.cfg.tasks, name)
            log.info("task set %s: %d tasks", name, len(sets[name]))
        return sets

    async def inference_endpoints(self) -> list[str]:
        pool = self.cfg.inference.pool
        if pool.endpoints or pool.openai or self.cfg.rollout.policy != "model":
            return list(pool.endpoints)
        starts = [
            self._start(f"inference-{i}", "t1.cli.inference", ["--port", "0"]) for i in range(pool.num_local_servers)
        ]
        return list(await asyncio.gather(*starts))

    async def trainer_endpoint(self) -> str:
        if self.cfg.trainer.endpoint:
            return self.cfg.trainer.endpoint
        return await self._start("trainer", "t1.cli.trainer", ["--port", "0"])

    async def _start(self, name: str, module: str, extra: list[str]) -> str:
        child = Child(name, service_argv(module, self.config_file, self.overrides, extra),
                      self.run_dir / "logs" / f"{name}.log")
        self.children.append(child)
        log.info("starting %s", name)
        return await child.start(CHILD_START_TIMEOUT_S, env=self.child_env)

    async def supervise(self) -> None:
        """Until cancelled: restart an inference child that exited; raise ChildFailed naming a child that
        cannot be restarted (the trainer, or one past its restarts)."""
        while True:
            await asyncio.sleep(SUPERVISE_EVERY_S)
            for child in list(self.children):
                if self._stopping or not child.exited:
                    continue
                what = child.describe_exit()
                if child.name == "trainer":
                    raise ChildFailed(f"{what}; the run stops (resume it with t1-coordinator --resume)")
                if child.restarts >= MAX_RESTARTS:
                    raise ChildFailed(f"{what}; it was restarted {child.restarts} times already")
                log.error("%s; restarting it (restart %d of %d)", what, child.restarts + 1, MAX_RESTARTS)
                await child.restart(CHILD_START_TIMEOUT_S, env=self.child_env)
                log.warning("%s is serving again on %s", child.name, child.address)

    def child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    async def stop(self, grace_s: float = 30.0) -> None:
        """Trainer first (it checkpoints), then inference servers."""
        self._stopping = True
        for child in sorted(self.children, key=lambda c: c.name != "trainer"):
            code = await child.stop(grace_s)
            log.info("%s stopped (exit %s)", child.name, code)
        self.children.clear()
