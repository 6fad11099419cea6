"""The torch backend: a transformers causal LM with KV-cache decoding, sampling, routing capture and prefix reuse.

Scheduling: every request runs as its own coroutine; each model step runs on one worker thread
under a FIFO lock. A prefill chunk is one step of one session, so a long prefill is cut into
chunks that cannot starve decoders. Decode steps go through a DecodeBatcher (batching.py): the
sessions waiting to decode one token, up to max_batch of one weight version, run as one batched
forward whatever their cache lengths, each row sampled with its own params and generator.
Each session's cache is a slot of the weight version's KvSlots (kv_slots.py): written in place,
never copied per step. A model whose cache is not plain full attention (or kv_slots=False) keeps
a DynamicCache per session and batches only sessions of equal cache length.

Weights: a request runs to its end on the model it started with; UpdateWeights loads the new
folder on the side, then swaps it in and drops the session caches built with the old weights.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig

from t1.inference.routing_capture import MoeShape, RoutingRecorder
from t1.inference.server.batching import (
    DecodeBatcher,
    DecodeItem,
    append_new_positions,
    split_routing,
    stack_caches,
)
from t1.inference.server.kv_slots import KvSlots, SlotCache
from t1.inference.server.sampling import LOGPROB_DISTRIBUTION, make_generator, sample_rows, sample_token
from t1.inference.server.slot_batch import SlotBatch
from t1.inference.server.validate import validate_request
from t1.inference.sessions import SessionEntry, SessionLRU, reusable_prefix
from t1.inference.types import (
    FinishReason,
    GenerateDone,
    GenerateRequest,
    GenerateResult,
    ModelInfo,
    SamplingParams,
    TokenChunk,
    collect,
)
from t1.model.forward import cache_kwargs
from t1.routing.block import RoutingBlock
from t1.rpc.errors import RequestError

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class _Loaded:
    """One weight version: the model, its routing hooks and its version number."""

    model: Any  # a transformers PreTrainedModel
    recorder: RoutingRecorder
    version: int
    slots: KvSlots | None  # the sessions' KV slots; None: a DynamicCache per session

    def new_cache(self) -> Any:
        return self.slots.new_cache() if self.slots is not None else DynamicCache(config=self.model.config)


@dataclass(slots=True)
class _Step:
    token: int
    logprob: float


def _load(path: Path, dtype: str, device: str) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model


def _cache_nbytes(cache: Any) -> int:
    if isinstance(cache, SlotCache):
        return cache.nbytes
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if layer.keys is not None)


def _crop(cache: Any, length: int) -> None:
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


class TorchBackend:
    """In-process generation on a Hugging Face model folder; also a GenerateFn (`await backend(request)`)."""

    def __init__(self, model_dir: str | Path, *, dtype: str = "float32", device: str = "cpu",
                 capture_routing: bool = True, session_cache_mb: int = 512, chunk_tokens: int = 16,
                 prefill_chunk: int = 1024, max_batch: int = 8, version: int = 0,
                 kv_slots: bool = True) -> None:
        self.model_dir = Path(model_dir)
        self.dtype, self.device = dtype, device
        self.capture_routing = capture_routing
        self.chunk_tokens, self.prefill_chunk = chunk_tokens, prefill_chunk
        self.kv_slots = kv_slots
        model = _load(self.model_dir, dtype, device)
        self._loaded = self._wrap(model, version)
        self._config: Any = model.config
        self.torch_device: torch.device = next(model.parameters()).device  # "cuda" resolved to "cuda:0"
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = int(model.config.max_position_embeddings)
        self.eos_ids = self._eos_ids(model)
        self.sessions = SessionLRU(session_cache_mb * 1024 * 1024)
        self._running_tokens = 0  # positions the requests running now hold (prompt and max_tokens each)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="t1-torch-step")
        self._step_lock: asyncio.Lock | None = None
        self._update_lock: asyncio.Lock | None = None
        self.num_steps = 0  # model forwards run (prefill chunks and decode batches), for tests and metrics
        self.batcher = DecodeBatcher(self._run_decode, max_batch, self._lock)

    def _wrap(self, model: Any, version: int) -> _Loaded:
        slots = KvSlots.for_model(model) if self.kv_slots else None
        return _Loaded(model, RoutingRecorder(model), version, slots)

    def _eos_ids(self, model: Any) -> tuple[int, ...]:
        try:
            eos = GenerationConfig.from_pretrained(str(self.model_dir)).eos_token_id
        except OSError:
            eos = model.config.eos_token_id
        if eos is None:
            return ()
        return tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))

    @property
    def policy_version(self) -> int:
        return self._loaded.version

    @property
    def moe(self) -> MoeShape | None:
        return self._loaded.recorder.shape

    def model_info(self) -> ModelInfo:
        moe = self.moe
        return ModelInfo(
            model_name=self.model_dir.name, backend="torch", policy_version=self.policy_version,
            vocab_size=self.vocab_size, max_context_tokens=self.max_context,
            num_moe_layers=moe.num_layers if moe else 0, num_experts=moe.num_experts if moe else 0,
            top_k=moe.top_k if moe else 0, routing_dtype=moe.dtype.name if moe else "",
            eos_token_ids=self.eos_ids, logprob_distribution=LOGPROB_DISTRIBUTION, dtype=self.dtype,
        )

    def kv_usage(self) -> tuple[int, int]:
        """(capacity, used) in KV positions: what session_cache_mb holds, and what the cached sessions (at what
        their caches cost: a KV slot row costs its whole capacity) and the running requests hold now."""
        config = self._config
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        position_bytes = 2 * int(config.num_hidden_layers) * heads * head_dim * DTYPES[self.dtype].itemsize
        return self.sessions.max_bytes // position_bytes, self.sessions.nbytes // position_bytes + self._running_tokens

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        return await collect(self.stream(request))

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await collect(self.stream(request))

    def _lock(self) -> asyncio.Lock:
        """The FIFO lock every model step runs under (made on first use, inside the event loop)."""
        if self._step_lock is None:
            self._step_lock = asyncio.Lock()
        return self._step_lock

    async def _run(self, fn, *args):
        async with self._lock():
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _forward(self, loaded: _Loaded, cache: Any, ids: np.ndarray, sink: list | None,
                 params: SamplingParams | None, gen: torch.Generator) -> _Step:
        """Feed ids through the model (extending cache, routing into sink); sample when params is given."""
        self.num_steps += 1
        loaded.recorder.sink = sink
        try:
            with torch.inference_mode():
                input_ids = torch.from_numpy(ids.astype(np.int64)).to(self.device)[None, :]
                out = loaded.model(input_ids=input_ids, use_cache=True, logits_to_keep=1,
                                   **cache_kwargs(loaded.model, cache))
        finally:
            loaded.recorder.sink = None
        if params is None:
            return _Step(-1, 0.0)
        token, logprob = sample_token(out.logits[0, -1], params, gen)
        return _Step(token, logprob)

    async def _run_decode(self, items: list[DecodeItem]) -> list[_Step]:
        """One decode batch on the worker thread; the batcher holds the step lock."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._forward_batch, items)

    def _forward_batch(self, items: list[DecodeItem]) -> list[_Step]:
        """One decode token for each item in one forward; all items have the same weights (and, for
        DynamicCaches, the same cache length)."""
        if len(items) == 1:
            one = items[0]
            return [self._forward(one.loaded, one.cache, np.array([one.token], np.int32), one.sink, one.params,
                                  one.gen)]
        self.num_steps += 1
        loaded = items[0].loaded
        order = list(range(len(items)))
        if isinstance(items[0].cache, SlotCache):
            batched: Any = SlotBatch([item.cache for item in items])
            order, items = batched.order, [items[i] for i in batched.order]  # the batch's rows are in slot order
            extra = {"attention_mask": batched.attention_mask, "position_ids": batched.position_ids}
        else:
            batched, extra = stack_caches([item.cache for item in items], loaded.model.config), {}
        capture = any(item.sink is not None for item in items)
        batch_sink = loaded.recorder.new_sink() if capture else None
        loaded.recorder.sink = batch_sink
        try:
            with torch.inference_mode():
                input_ids_B1 = torch.tensor([[item.token] for item in items], dtype=torch.int64, device=self.device)
                out = loaded.model(input_ids=input_ids_B1, use_cache=True, logits_to_keep=1,
                                   **cache_kwargs(loaded.model, batched), **extra)
        finally:
            loaded.recorder.sink = None
        if isinstance(batched, SlotBatch):
            batched.commit()
        else:
            append_new_positions(batched, [item.cache for item in items], 1)
        if batch_sink is not None:
            split_routing(batch_sink, [item.sink for item in items])
        sampled = sample_rows(out.logits[:, -1], [item.params for item in items], [item.gen for item in items])
        steps: list[_Step] = [_Step(-1, 0.0)] * len(items)
        for row, (token, logprob) in zip(order, sampled, strict=True):
            steps[row] = _Step(token, logprob)
        return steps

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateDone]:
        """Generate one turn, yielding TokenChunks then one GenerateDone; raises RequestError on bad input."""
        validate_request(request, self.vocab_size, self.max_context)
        held = len(request.prompt_ids) + request.sampling.max_tokens
        self._running_tokens += held
        events = self._generate(request)
        try:
            async for event in events:
                yield event
        finally:
            self._running_tokens -= held
            await events.aclose()  # at once: a cancelled request frees its KV slot now, not at collection

    async def _generate(self, request: GenerateRequest) -> AsyncGenerator[TokenChunk | GenerateDone, None]:
        loaded = self._loaded
        prompt = np.asarray(request.prompt_ids, dtype=np.int32)
        params = request.sampling
        capture = request.return_routing and self.capture_routing and loaded.recorder.shape is not None
        entry = self.sessions.take(request.session_id, loaded.version) if request.session_id else None
        reuse = reusable_prefix(entry.ids, prompt) if entry is not None else 0
        if entry is not None and reuse > 0:
            cache = entry.cache
            _crop(cache, reuse)
        else:
            cache, reuse = loaded.new_cache(), 0
        gen = make_generator(params.seed, self.torch_device)  # where the logits are: sampling stays on device
        stops = set(self.eos_ids) | set(params.stop_token_ids)
        sink = loaded.recorder.new_sink() if capture else None
        tokens: list[int] = []
        logprobs: list[float] = []
        sent = 0
        new_ids = prompt[reuse:]
        for begin in range(0, len(new_ids), self.prefill_chunk):
            chunk = new_ids[begin:begin + self.prefill_chunk]
            last = begin + self.prefill_chunk >= len(new_ids)
            step = await self._run(self._forward, loaded, cache, chunk, sink, params if last else None, gen)
        while True:
            tokens.append(step.token)
            logprobs.append(step.logprob)
            if step.token in stops:
                finish = FinishReason.STOP
            elif len(tokens) >= params.max_tokens or len(prompt) + len(tokens) >= self.max_context:
                finish = FinishReason.LENGTH
            else:
                finish = None
            if finish is not None or len(tokens) - sent >= self.chunk_tokens:
                yield self._chunk(tokens[sent:], logprobs[sent:], loaded.version)
                sent = len(tokens)
            if finish is not None:
                break
            step = await self.batcher.decode(DecodeItem(loaded, cache, step.token, sink, params, gen))
        if request.session_id:
            ids = np.concatenate([prompt, np.asarray(tokens[:-1], np.int32)])
            self.sessions.put(request.session_id, SessionEntry(ids, cache, loaded.version, _cache_nbytes(cache)))
        experts = loaded.recorder.to_array(sink) if sink is not None else None
        routing = RoutingBlock(start=reuse, experts=experts) if experts is not None else None
        yield GenerateDone(finish, loaded.version, routing, len(prompt), reuse, len(tokens))

    @staticmethod
    def _chunk(tokens: list[int], logprobs: list[float], version: int) -> TokenChunk:
        return TokenChunk(np.asarray(tokens, np.int32), np.asarray(logprobs, np.float32), version)

    async def update_weights(self, path: str | Path, version: int) -> float:
        """Load a weights folder and swap it in atomically; returns the load time in seconds."""
        folder = Path(path)
        if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
            raise RequestError(f"path: {folder} is not a model folder with config.json and *.safetensors")
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            t0 = time.perf_counter()
            model = await asyncio.to_thread(_load, folder, self.dtype, self.device)
            self._check_compatible(model, folder)
            self._loaded = self._wrap(model, int(version))
            self.sessions.clear()
            seconds = time.perf_counter() - t0
        log.info("loaded weights version %d from %s in %.2fs", version, folder, seconds)
        return seconds

    def _check_compatible(self, model: Any, folder: Path) -> None:
        new, old = model.config, self._config
        for key in ("vocab_size", "num_hidden_layers", "hidden_size", "max_position_embeddings"):
            if getattr(new, key, None) != getattr(old, key, None):
                raise RequestError(f"path: {folder} has {key}={getattr(new, key, None)}, the served model "
                                   f"has {getattr(old, key, None)}")

    async def close(self) -> None:
        self.batcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.sessions.clear()
