"""The coordinator's parts, built from config: tokenizer renderers, sandboxes, generate functions, stores.

Nothing here runs a loop; app.py starts and stops these parts in its documented order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from t1.agent.formats import AgentFormat, FormatName, get_format
from t1.agent.scripted import ScriptedPolicy
from t1.config.schema import T1Config
from t1.coordinator.evals import EvalAttempt
from t1.inference.types import GenerateFn
from t1.metrics.registry import REGISTRY
from t1.rpc.errors import RequestError
from t1.tasks.spec import TaskSpec
from t1.tito import ChatRenderer
from t1.tito.render import ChatTokenizer

if TYPE_CHECKING:
    from t1.inference.pool import InferencePool

log = logging.getLogger(__name__)


def make_renderers(model_path: Path) -> dict[FormatName, ChatRenderer]:
    """One renderer per agent format (the tool-call format puts its tools into the template)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    eot = tok.eos_token
    if not eot:
        raise ValueError(f"inference.model.path: the tokenizer of {model_path} has no eos_token (end of turn)")
    chat = cast(ChatTokenizer, tok)
    return {name: ChatRenderer(chat, end_of_turn=eot, tools=get_format(name).tools) for name in FormatName}


def ensure_model(cfg: T1Config) -> Path:
    """The policy model folder, created from its preset when missing (the local run)."""
    model = cfg.inference.model
    if (model.path / "config.json").is_file():
        return model.path
    if model.init_preset is None:
        raise FileNotFoundError(f"inference.model.path: {model.path} holds no model and init_preset is null")
    from t1.model.init import init_model

    log.info("creating the %s model in %s", model.init_preset, model.path)
    return init_model(model.path, model.init_preset, model.init_seed)


class GenerateRouter:
    """Picks the generate function of an episode: the scripted policy, a job's own pool, or the run's pool."""

    def __init__(self, cfg: T1Config, renderers: dict[FormatName, ChatRenderer]) -> None:
        self.cfg = cfg
        self.scripted = ScriptedPolicy(renderers[FormatName.TOOL_CALLS]) \
            if cfg.rollout.policy == "oracle_script" else None
        self.pool: InferencePool | None = None  # the run's pool, set by connect()
        self._job_pools: dict[tuple[str, ...], InferencePool] = {}

    def connect(self, endpoints: Sequence[str]) -> None:
        from t1.inference.pool import InferencePool

        self.pool = InferencePool(self.cfg.inference.pool, list(endpoints), auth=self.cfg.auth, registry=REGISTRY)

    def num_healthy_servers(self) -> int:
        """Healthy replicas of the run's pool (0 before it is connected)."""
        return len(self.pool.healthy_endpoints) if self.pool is not None else 0

    def __call__(self, job: EvalAttempt | None, task: TaskSpec, fmt: AgentFormat) -> GenerateFn:
        """The generate function of one episode of `task` (of eval job `job`, or training when None)."""
        if self.scripted is not None:
            return self.scripted.for_episode(task, fmt)  # encoding the replies needs no tools
        if job is not None and job.inference_endpoints:
            key = tuple(job.inference_endpoints)
            if key not in self._job_pools:
                from t1.inference.pool import InferencePool

                self._job_pools[key] = InferencePool(self.cfg.inference.pool, list(key), auth=self.cfg.auth)
            return self._job_pools[key]
        if self.pool is None:
            raise RequestError("no inference servers: set inference.pool.endpoints or run locally")
        return self.pool

    async def close(self) -> None:
        pools = [p for p in [self.pool, *self._job_pools.values()] if p is not None]
        await asyncio.gather(*(p.close() for p in pools))
