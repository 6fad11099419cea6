"""The torch backend in process: determinism, logprob and routing fidelity, prefix reuse, versions, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from inference_helpers import prompt

from t1.inference.routing_capture import RoutingRecorder
from t1.inference.server.sampling import sampling_logprobs
from t1.inference.types import FinishReason, GenerateRequest, SamplingParams, TokenChunk
from t1.rpc.errors import RequestError


def req(ids: np.ndarray, session: str = "", **sampling) -> GenerateRequest:
    sampling.setdefault("seed", 7)
    sampling.setdefault("max_tokens", 24)
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(**sampling))


def full_forward(backend, ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """One float32 forward over the whole sequence: logits [T, V] and routing [T, L, K]."""
    model = backend._loaded.model
    rec = RoutingRecorder(model)
    rec.start()
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(ids.astype(np.int64))[None]).logits[0]
    routing = rec.stop()
    rec.close()
    return logits, routing


async def test_same_seed_same_tokens_other_seed_other_tokens(backend) -> None:
    p = prompt(30)
    a = await backend(req(p, temperature=1.0))
    b = await backend(req(p, temperature=1.0))
    c = await backend(req(p, temperature=1.0, seed=8))
    assert a.token_ids.tolist() == b.token_ids.tolist()
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert a.token_ids.tolist() != c.token_ids.tolist()


@pytest.mark.parametrize("sampling", [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 50},
    {"temperature": 1.3, "top_p": 0.9},
    {"temperature": 0.0},
])
async def test_logprobs_and_routing_equal_a_full_float32_forward(backend, sampling) -> None:
    p = prompt(40, seed=1)
    res = await backend(req(p, max_tokens=32, **sampling))
    n = len(res.token_ids)
    assert n >= 1 and res.logprobs.dtype == np.float32 and res.token_versions.tolist() == [0] * n
    seq = np.concatenate([p, res.token_ids])
    logits, routing = full_forward(backend, seq[:-1])
    params = SamplingParams(**sampling)
    expected = [float(sampling_logprobs(logits[len(p) - 1 + i], params)[tok]) for i, tok in enumerate(res.token_ids)]
    np.testing.assert_allclose(res.logprobs, expected, atol=1e-4, rtol=0)
    block = res.routing
    assert block is not None and block.start == 0
    info = backend.model_info()
    assert block.experts.shape == (len(p) + n - 1, info.num_moe_layers, info.top_k)
    assert block.experts.dtype == np.uint8 and int(block.experts.max()) < info.num_experts
    assert not block.missing_rows().any()
    ordered = np.sort(block.experts, axis=-1)
    assert (np.diff(ordered.astype(int), axis=-1) > 0).all(), "expert ids repeat within a row"
    np.testing.assert_array_equal(np.sort(block.experts, -1), np.sort(routing, -1))


async def test_prefix_reuse_over_20_turns_prefills_only_new_tokens_and_matches_no_reuse(backend) -> None:
    context = prompt(50, seed=2)
    rng = np.random.default_rng(3)
    known = 0  # positions the session's cache holds: last context plus all but the last sampled token
    for turn in range(20):
        sampling = {"temperature": 1.0, "seed": 100 + turn, "max_tokens": 6}
        r = await backend(req(context, "sess-A", **sampling))
        q = await backend(req(context, "", **sampling))  # no session: full prefill every time
        assert r.prompt_tokens == len(context)
        assert r.cached_tokens == known, f"turn {turn}"
        assert r.routing is not None and r.routing.start == known
        assert r.routing.num_tokens == len(context) - known + len(r.token_ids) - 1
        assert q.cached_tokens == 0
        assert r.token_ids.tolist() == q.token_ids.tolist()
        np.testing.assert_allclose(r.logprobs, q.logprobs, atol=1e-4)
        np.testing.assert_array_equal(np.sort(r.routing.experts, -1), np.sort(q.routing.experts[known:], -1))
        known = len(context) + len(r.token_ids) - 1
        delta = rng.integers(16, 1024, size=int(rng.integers(3, 12))).astype(np.int32)
        context = np.concatenate([context, r.token_ids, delta])


async def test_mismatched_prompt_reuses_only_the_common_prefix(backend) -> None:
    p = prompt(40, seed=4)
    first = await backend(req(p, "sess-B", max_tokens=4))
    edited = np.concatenate([p[:20], prompt(25, seed=5)])
    second = await backend(req(edited, "sess-B", max_tokens=4))
    fresh = await backend(req(edited, "", max_tokens=4))
    assert first.cached_tokens == 0 and second.cached_tokens == 20
    assert second.token_ids.tolist() == fresh.token_ids.tolist()


async def test_stop_token_ends_the_turn_and_is_the_last_token(backend) -> None:
    p = prompt(20, seed=6)
    free = await backend(req(p, temperature=0.0, max_tokens=10))
    stop = int(free.token_ids[3])
    first = free.token_ids.tolist().index(stop)
    res = await backend(req(p, temperature=0.0, max_tokens=10, stop_token_ids=(stop,)))
    assert res.finish_reason == FinishReason.STOP
    assert res.token_ids.tolist() == free.token_ids[: first + 1].tolist()
    assert free.finish_reason == FinishReason.LENGTH and len(free.token_ids) == 10


@pytest.mark.parametrize(("ids", "sampling", "field"), [
    (np.zeros(0, np.int32), {}, "prompt_ids"),
    (np.array([5, 1024], np.int32), {}, "prompt_ids"),
    (np.array([5, -1], np.int32), {}, "prompt_ids"),
    (np.array([5, 6], np.int32), {"max_tokens": 8192}, "sampling.max_tokens"),
    (np.array([5, 6], np.int32), {"max_tokens": 0}, "sampling.max_tokens"),
    (np.array([5, 6], np.int32), {"temperature": -1.0}, "sampling.temperature"),
    (np.array([5, 6], np.int32), {"top_p": 1.5}, "sampling.top_p"),
])
async def test_bad_requests_name_the_field(backend, ids, sampling, field) -> None:
    with pytest.raises(RequestError, match=field.replace(".", r"\.")):
        await backend(req(ids, **sampling))


async def test_cancelled_stream_drops_the_session_and_the_backend_keeps_working(backend) -> None:
    p = prompt(30, seed=9)
    stream = backend.stream(req(p, "sess-C", max_tokens=200))
    first = await anext(stream)
    assert isinstance(first, TokenChunk)
    await stream.aclose()
    assert backend.sessions.take("sess-C", backend.policy_version) is None
    again = await backend(req(p, "sess-C", max_tokens=4))
    assert again.cached_tokens == 0 and len(again.token_ids) == 4


async def test_concurrent_sessions_interleave_and_match_sequential_runs(backend) -> None:
    prompts = [prompt(30 + 5 * i, seed=20 + i) for i in range(3)]
    sequential = [await backend(req(p, max_tokens=12)) for p in prompts]
    together = await asyncio.gather(*(backend(req(p, f"par-{i}", max_tokens=12)) for i, p in enumerate(prompts)))
    for s, t in zip(sequential, together, strict=True):
        assert s.token_ids.tolist() == t.token_ids.tolist()


async def test_update_weights_swaps_atomically(backend, tmp_path: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend
    from t1.model.init import init_model

    other = init_model(tmp_path / "v1", "tiny", seed=1)
    p = prompt(30, seed=11)
    before = await backend(req(p, max_tokens=20))
    stream = backend.stream(req(p, "sess-D", max_tokens=20))
    chunks = [await anext(stream)]
    seconds = await backend.update_weights(str(other), version=1)
    chunks += [c async for c in stream]
    running_ids = np.concatenate([c.token_ids for c in chunks if isinstance(c, TokenChunk)])
    assert running_ids.tolist() == before.token_ids.tolist(), "a running request finishes on the old weights"
    assert {c.policy_version for c in chunks} == {0}
    assert seconds > 0 and backend.model_info().policy_version == 1
    after = await backend(req(p, "sess-D", max_tokens=20))
    assert after.policy_version == 1 and after.token_versions.tolist() == [1] * len(after.token_ids)
    assert after.cached_tokens == 0, "caches built with old weights are dropped"
    fresh = TorchBackend(other)
    assert (await fresh(req(p, max_tokens=20))).token_ids.tolist() == after.token_ids.tolist()
    await fresh.close()
    with pytest.raises(RequestError, match="path"):
        await backend.update_weights(str(tmp_path / "missing"), version=2)
