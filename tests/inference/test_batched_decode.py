"""Batched decode in the torch backend: sessions decoding together give what each gives alone."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import numpy as np
import pytest
from inference_helpers import prompt

from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams, TokenChunk

SAMPLINGS = [
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "top_k": 50, "seed": 2},
    {"temperature": 1.3, "top_p": 0.9, "seed": 3},
    {"temperature": 0.0},
]


def req(ids: np.ndarray, session: str = "", **sampling) -> GenerateRequest:
    sampling.setdefault("max_tokens", 16)
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(**sampling))


def assert_same(alone: GenerateResult, batched: GenerateResult) -> None:
    assert batched.token_ids.tolist() == alone.token_ids.tolist()
    np.testing.assert_allclose(batched.logprobs, alone.logprobs, atol=1e-4, rtol=0)
    assert alone.routing is not None and batched.routing is not None
    assert batched.routing.start == alone.routing.start
    np.testing.assert_array_equal(np.sort(batched.routing.experts, -1), np.sort(alone.routing.experts, -1))


async def quiet(backend) -> None:
    """Wait until the batcher has run its last batch and the worker thread has let go of it, then collect."""
    driver = backend.batcher._driver
    if driver is not None:
        await driver
    await backend._run(int)  # the worker thread drops a work item before it takes the next
    gc.collect()


async def test_sessions_of_equal_length_decode_in_one_batch_and_match_alone(backend) -> None:
    prompts = [prompt(30, seed=40 + i) for i in range(len(SAMPLINGS))]
    alone = [await backend(req(p, **s)) for p, s in zip(prompts, SAMPLINGS, strict=True)]
    backend.batcher.batch_sizes.clear()
    steps = backend.num_steps
    together = await asyncio.gather(*(backend(req(p, f"b-{i}", **s))
                                      for i, (p, s) in enumerate(zip(prompts, SAMPLINGS, strict=True))))
    assert max(backend.batcher.batch_sizes) == len(prompts), "equal-length sessions were not batched"
    # 4 prefills, then 15 decode steps for all four rows at once.
    assert backend.num_steps - steps == len(prompts) + 15
    for a, t in zip(alone, together, strict=True):
        assert_same(a, t)


async def test_sessions_of_unequal_lengths_share_one_forward_and_match_alone(backend) -> None:
    backend.eos_ids = ()  # every request runs to max_tokens, so the step count is exact
    prompts = [prompt(n, seed=50 + i) for i, n in enumerate((9, 31, 58, 87))]
    alone = [await backend(req(p, **s)) for p, s in zip(prompts, SAMPLINGS, strict=True)]
    backend.batcher.batch_sizes.clear()
    steps = backend.num_steps
    together = await asyncio.gather(*(backend(req(p, f"u-{i}", **s))
                                      for i, (p, s) in enumerate(zip(prompts, SAMPLINGS, strict=True))))
    assert backend.batcher.batch_sizes == [len(prompts)] * 15, "unequal lengths were not decoded together"
    assert backend.num_steps - steps == len(prompts) + 15
    for p, a, t in zip(prompts, alone, together, strict=True):
        assert_same(a, t)
        # One routing row per processed position and none from another row's padding.
        assert t.routing is not None and t.routing.experts.shape[0] == len(p) + len(t.token_ids) - 1


async def test_kv_slots_give_what_a_dynamic_cache_gives(backend, tiny_model_dir: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    reference = TorchBackend(tiny_model_dir, chunk_tokens=4, kv_slots=False, prefill_chunk=16)
    try:
        assert reference._loaded.slots is None and backend._loaded.slots is not None
        prompts = [prompt(n, seed=55 + i) for i, n in enumerate((40, 13, 70))]
        sampling = {"temperature": 1.0, "seed": 4, "max_tokens": 20}
        expected = [await reference(req(p, **sampling)) for p in prompts]
        together = await asyncio.gather(*(backend(req(p, **sampling)) for p in prompts))
        for e, t in zip(expected, together, strict=True):
            assert_same(e, t)
    finally:
        await reference.close()


async def test_without_kv_slots_only_equal_lengths_share_a_forward(tiny_model_dir: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    grouped = TorchBackend(tiny_model_dir, chunk_tokens=4, kv_slots=False)
    try:
        prompts = [prompt(20, seed=50), prompt(20, seed=51), prompt(27, seed=52)]
        alone = [await grouped(req(p, temperature=1.0, seed=9)) for p in prompts]
        grouped.batcher.batch_sizes.clear()
        together = await asyncio.gather(*(grouped(req(p, temperature=1.0, seed=9)) for p in prompts))
        assert max(grouped.batcher.batch_sizes) == 2
        for a, t in zip(alone, together, strict=True):
            assert_same(a, t)
    finally:
        await grouped.close()


async def test_slots_and_capacity_grow_while_rows_decode(backend) -> None:
    from t1.inference.server.kv_slots import FIRST_CAPACITY, FIRST_SLOTS

    backend.eos_ids = ()
    n = 2 * FIRST_SLOTS + 1
    # Prompts just under the first capacity: every row grows past it while the batch decodes.
    prompts = [prompt(FIRST_CAPACITY - 30 + 2 * i, seed=100 + i) for i in range(n)]
    sampling = {"temperature": 1.0, "max_tokens": 40}
    alone = [await backend(req(p, seed=i, **sampling)) for i, p in enumerate(prompts)]
    slots = backend._loaded.slots
    assert slots is not None and slots.num_slots == FIRST_SLOTS and slots.capacity > FIRST_CAPACITY
    fresh = backend._wrap(backend._loaded.model, backend.policy_version)  # new slots of the first size
    backend._loaded = fresh
    together = await asyncio.gather(*(backend(req(p, seed=i, **sampling)) for i, p in enumerate(prompts)))
    assert fresh.slots is not None and fresh.slots.num_slots >= n and fresh.slots.capacity > FIRST_CAPACITY
    for a, t in zip(alone, together, strict=True):
        assert_same(a, t)
    await quiet(backend)
    assert fresh.slots.num_free == fresh.slots.num_slots, "a finished request kept its slot"


async def test_rows_moved_to_the_front_slots_keep_idle_sessions_intact(backend) -> None:
    backend.eos_ids = ()
    sampling = {"temperature": 1.0, "seed": 3, "max_tokens": 6}
    idle = [prompt(20 + 9 * i, seed=110 + i) for i in range(3)]
    first = [await backend(req(p, f"idle-{i}", **sampling)) for i, p in enumerate(idle)]  # slots 0-2, then idle
    busy = [prompt(15 + 11 * i, seed=120 + i) for i in range(3)]
    alone = [await backend(req(p, **sampling)) for p in busy]
    slots = backend._loaded.slots
    moves_before = slots.moves
    together = await asyncio.gather(*(backend(req(p, **sampling)) for p in busy))  # on slots 3-5: moved to 0-2
    assert slots.moves > moves_before, "the batch never had to move rows"
    for a, t in zip(alone, together, strict=True):
        assert_same(a, t)
    for i, (p, r) in enumerate(zip(idle, first, strict=True)):  # the idle sessions' caches were swapped, not lost
        context = np.concatenate([p, r.token_ids, prompt(4, seed=130 + i)])
        resumed = await backend(req(context, f"idle-{i}", **sampling))
        fresh = await backend(req(context, **sampling))
        assert resumed.cached_tokens == len(p) + len(r.token_ids) - 1
        assert resumed.token_ids.tolist() == fresh.token_ids.tolist()
        np.testing.assert_allclose(resumed.logprobs, fresh.logprobs, atol=1e-4, rtol=0)


async def test_prefix_reuse_holds_when_turns_are_batched(backend) -> None:
    contexts = [prompt(25 + 8 * i, seed=60 + i) for i in range(3)]  # unequal lengths: batched with slots
    for turn in range(3):
        results = await asyncio.gather(*(backend(req(c, f"reuse-{i}", temperature=1.0, seed=turn, max_tokens=5))
                                         for i, c in enumerate(contexts)))
        fresh = [await backend(req(c, temperature=1.0, seed=turn, max_tokens=5)) for c in contexts]
        for i, (r, f) in enumerate(zip(results, fresh, strict=True)):
            expected_cached = 0 if turn == 0 else len(contexts[i]) - 4  # 3 delta tokens + the unfed last token
            assert r.routing is not None and r.routing.start == expected_cached
            assert r.cached_tokens == expected_cached
            assert r.token_ids.tolist() == f.token_ids.tolist()
            np.testing.assert_allclose(r.logprobs, f.logprobs, atol=1e-4, rtol=0)
            assert r.routing is not None and f.routing is not None
            np.testing.assert_array_equal(np.sort(r.routing.experts, -1),
                                          np.sort(f.routing.experts[r.cached_tokens:], -1))
        contexts = [np.concatenate([c, r.token_ids, prompt(3, seed=70 + turn)]) for c, r in zip(contexts, results,
                                                                                               strict=True)]


async def test_a_cancelled_row_leaves_the_batch_and_the_others_finish(backend) -> None:
    backend.eos_ids = ()
    prompts = [prompt(n, seed=80 + i) for i, n in enumerate((30, 47, 19))]
    alone = [await backend(req(p, temperature=1.0, seed=i, max_tokens=24)) for i, p in enumerate(prompts)]
    doomed = backend.stream(req(prompts[0], "doomed", temperature=1.0, seed=0, max_tokens=200))

    async def cancel_early() -> None:
        first = await anext(doomed)
        assert isinstance(first, TokenChunk)
        await doomed.aclose()

    backend.batcher.batch_sizes.clear()
    _, *rest = await asyncio.gather(cancel_early(), *(backend(req(p, temperature=1.0, seed=i + 1, max_tokens=24))
                                                      for i, p in enumerate(prompts[1:])))
    assert max(backend.batcher.batch_sizes) == 3 and backend.batcher.batch_sizes[-1] == 2
    for a, t in zip(alone[1:], rest, strict=True):
        assert_same(a, t)
    assert backend.sessions.take("doomed", backend.policy_version) is None
    await quiet(backend)
    slots = backend._loaded.slots
    assert slots.num_free == slots.num_slots, "the cancelled row kept its slot"


async def test_a_batch_never_mixes_weight_versions(backend, tmp_path: Path) -> None:
    from t1.model.init import init_model

    other = init_model(tmp_path / "v1", "tiny", seed=1)
    p_old, p_new = prompt(30, seed=90), prompt(41, seed=91)
    kept = await backend(req(p_old, "kept", temperature=1.0, seed=5, max_tokens=4))
    old_slots = backend._loaded.slots
    old_alone = await backend(req(p_old, temperature=1.0, seed=5, max_tokens=20))
    old_stream = backend.stream(req(p_old, temperature=1.0, seed=5, max_tokens=20))
    chunks = [await anext(old_stream)]
    await backend.update_weights(str(other), version=1)
    new_alone = await backend(req(p_new, temperature=1.0, seed=6, max_tokens=20))

    async def finish_old() -> list:
        return chunks + [c async for c in old_stream]

    backend.batcher.batch_sizes.clear()
    old_chunks, new_together = await asyncio.gather(finish_old(), backend(req(p_new, temperature=1.0, seed=6,
                                                                              max_tokens=20)))
    assert max(backend.batcher.batch_sizes) == 1, "rows of two weight versions shared a forward"
    old_ids = np.concatenate([c.token_ids for c in old_chunks if isinstance(c, TokenChunk)])
    assert old_ids.tolist() == old_alone.token_ids.tolist()
    assert {c.policy_version for c in old_chunks} == {0}
    assert new_together.policy_version == 1 and new_together.token_ids.tolist() == new_alone.token_ids.tolist()
    again = await backend(req(np.concatenate([p_old, kept.token_ids]), "kept", temperature=1.0, seed=5, max_tokens=4))
    assert kept.cached_tokens == 0 and again.cached_tokens == 0, "a cache of the old weights was reused"
    assert backend._loaded.slots is not old_slots
    await quiet(backend)
    assert old_slots.num_free == old_slots.num_slots, "the old weights' slots are still held"


@pytest.mark.parametrize("max_batch", [0, -1])
async def test_max_batch_below_one_is_refused(max_batch: int) -> None:
    from t1.inference.server.batching import DecodeBatcher

    async def run(items):
        return items

    with pytest.raises(ValueError, match="max_batch"):
        DecodeBatcher(run, max_batch, asyncio.Lock)
