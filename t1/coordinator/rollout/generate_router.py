"""GenerateRouter: picks each episode's generate function (the scripted policy, an eval job's own pool, or
the run's pool: T1's gRPC servers, or OpenAI-compatible ones when inference.pool.openai is set) and owns
the pools it made."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from t1.agent.formats import AgentFormat, FormatName
from t1.agent.scripted import ScriptedPolicy
from t1.config.inference import OpenAIEndpointConfig
from t1.config.schema import T1Config
from t1.coordinator.evals.eval_jobs import EvalAttempt
from t1.inference.types import GenerateFn
from t1.metrics.registry import REGISTRY
from t1.rpc.errors import RequestError
from t1.tasks.spec import TaskSpec
from t1.tito import ChatRenderer

if TYPE_CHECKING:
    from t1.inference.client.pool import InferencePool
    from t1.inference.openai.openai_pool import OpenAIPool

    Pool = InferencePool | OpenAIPool


class GenerateRouter:
    """Picks the generate function of an episode: the scripted policy, a job's own pool, or the run's pool."""

    def __init__(self, cfg: T1Config, renderers: dict[FormatName, ChatRenderer]) -> None:
        self.cfg = cfg
        self.scripted = ScriptedPolicy(renderers[FormatName.TOOL_CALLS]) \
            if cfg.rollout.policy == "oracle_script" else None
        self.pool: Pool | None = None  # the run's pool, set by connect() (at once for OpenAI endpoints)
        self._job_pools: dict[tuple[str, ...], InferencePool] = {}
        self._openai_pools: dict[OpenAIEndpointConfig, OpenAIPool] = {}
        if cfg.inference.pool.openai and self.scripted is None:
            self.pool = self._openai(cfg.inference.pool.openai, registry=True)

    def connect(self, endpoints: Sequence[str]) -> None:
        from t1.inference.client.pool import InferencePool

        self.pool = InferencePool(self.cfg.inference.pool, list(endpoints), auth=self.cfg.auth, registry=REGISTRY)

    def _openai(self, endpoints: Sequence[OpenAIEndpointConfig], registry: bool = False) -> OpenAIPool:
        from t1.inference.openai.openai_pool import OpenAIPool

        return OpenAIPool.from_model(self.cfg.inference.pool, self.cfg.inference.model.path, endpoints,
                                     registry=REGISTRY if registry else None)

    async def check_trainable(self) -> None:
        """Training over OpenAI-compatible endpoints: refuse, before any episode, one that returns no token ids."""
        from t1.inference.openai.openai_pool import OpenAIPool

        if isinstance(self.pool, OpenAIPool):
            await self.pool.check_token_ids()

    def num_healthy_servers(self) -> int:
        """Healthy replicas of the run's pool (0 before it is connected)."""
        return len(self.pool.healthy_endpoints) if self.pool is not None else 0

    def __call__(self, job: EvalAttempt | None, task: TaskSpec, fmt: AgentFormat) -> GenerateFn:
        """The generate function of one episode of `task` (of eval job `job`, or training when None)."""
        if self.scripted is not None:
            return self.scripted.for_episode(task, fmt)  # encoding the replies needs no tools
        if job is not None and job.openai is not None:
            if job.openai not in self._openai_pools:
                self._openai_pools[job.openai] = self._openai([job.openai])
            return self._openai_pools[job.openai]
        if job is not None and job.inference_endpoints:
            key = tuple(job.inference_endpoints)
            if key not in self._job_pools:
                from t1.inference.client.pool import InferencePool

                self._job_pools[key] = InferencePool(self.cfg.inference.pool, list(key), auth=self.cfg.auth)
            return self._job_pools[key]
        if self.pool is None:
            raise RequestError("no inference servers: set inference.pool.endpoints or run locally")
        return self.pool

    async def close(self) -> None:
        pools: list[Pool] = [p for p in [self.pool, *self._job_pools.values(), *self._openai_pools.values()]
                             if p is not None]
        await asyncio.gather(*(p.close() for p in pools))
