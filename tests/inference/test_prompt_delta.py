"""Prompt deltas through the real pool and server: what is sent, what the model sees, and every fallback."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import grpc
import numpy as np
import pytest
from inference_helpers import prompt

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool
from t1.inference.convert import request_from_proto
from t1.inference.prompt_delta import BaseUnknown, ServedContexts
from t1.inference.server.servicer import SERVICE_NAME, InferenceServicer
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.errors import RequestError
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import common_pb2, inference_pb2_grpc
from t1.v1 import inference_pb2 as pb


class Recording:
    """The backend, and every prompt the server handed it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.prompts: list[np.ndarray] = []

    def stream(self, req):
        self.prompts.append(np.array(req.prompt_ids))
        return self.inner.stream(req)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class WithoutDeltas(InferenceServicer):
    """A server as it was before prompt deltas: prompt_ids is required."""

    def _request(self, request):
        return request_from_proto(request)


async def serve(servicer: InferenceServicer) -> GrpcServer:
    server = GrpcServer([ServiceBinding(SERVICE_NAME, inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                                        servicer)], ServerConfig(host="127.0.0.1", port=0, grace_s=0.2), AuthConfig())
    await server.start()
    return server


def req(ids: np.ndarray, seed: int, session: str = "episode/s0") -> GenerateRequest:
    return GenerateRequest(session, ids, SamplingParams(seed=seed, max_tokens=12))


def metric(pool: InferencePool, name: str) -> float:
    return pool.metrics.registry.get_sample_value(name) or 0.0


def read_only(ids: np.ndarray) -> np.ndarray:
    view = np.asarray(ids, np.int32)
    view.flags.writeable = False  # as TokenBuffer hands its prompts over
    return view


@pytest.fixture
async def recording(tiny_model_dir: Path):
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, chunk_tokens=4)
    yield Recording(backend)
    await backend.close()


@pytest.mark.parametrize("batched", [True, False])
async def test_continuing_turns_send_deltas_and_the_model_sees_and_samples_the_whole_context(recording, batched):
    servicer = InferenceServicer(recording)
    server = await serve(servicer)
    pool = InferencePool(InferencePoolConfig(batched_stream=batched), [server.address])
    context = prompt(80, seed=1)
    try:
        for turn in range(5):
            res = await pool(req(read_only(context), seed=100 + turn))
            assert recording.prompts[-1].tolist() == context.tolist(), f"turn {turn}: the server's prompt"
            expected = await recording.inner(req(context, seed=100 + turn))  # the whole prompt, directly
            assert res.token_ids.tolist() == expected.token_ids.tolist(), f"turn {turn}"
            context = np.concatenate([context, res.token_ids, prompt(7, seed=turn)])
    finally:
        await pool.close()
        await server.stop()
    assert servicer.prompt_deltas == 4  # every turn after the first
    assert metric(pool, "t1_inference_prompt_deltas_total") == 4
    assert metric(pool, "t1_inference_prompt_resends_total") == 0


async def converse(servicer: InferenceServicer, recording: Recording, seed: int, turns: int = 4,
                   before_turn=None) -> InferencePool:
    """`turns` continuing turns of one session through a pool, each checking the prompt the model saw."""
    server = await serve(servicer)
    pool = InferencePool(InferencePoolConfig(), [server.address])
    context = prompt(80, seed=seed)
    try:
        for turn in range(turns):
            if before_turn is not None:
                before_turn(turn)
            res = await pool(req(read_only(context), seed=turn))
            assert recording.prompts[-1].tolist() == context.tolist(), f"turn {turn}"
            context = np.concatenate([context, res.token_ids, prompt(5, seed=turn)])
    finally:
        await pool.close()
        await server.stop()
    return pool


async def test_a_server_that_lost_the_context_gets_the_whole_prompt_and_deltas_go_on(recording):
    servicer = InferenceServicer(recording)

    def lose_contexts(turn: int) -> None:
        if turn == 2:
            servicer.contexts = ServedContexts()  # evicted, or the server restarted

    pool = await converse(servicer, recording, seed=2, before_turn=lose_contexts)
    assert metric(pool, "t1_inference_prompt_resends_total") == 1
    assert metric(pool, "t1_inference_prompt_deltas_total") == 3  # turns 1, 2 (refused) and 3
    assert servicer.prompt_deltas == 2 and len(recording.prompts) == 4  # served as deltas: turns 1 and 3


async def test_a_server_without_deltas_is_sent_whole_prompts_after_its_first_refusal(recording):
    pool = await converse(WithoutDeltas(recording), recording, seed=3)
    assert metric(pool, "t1_inference_prompt_deltas_total") == 1
    assert metric(pool, "t1_inference_prompt_resends_total") == 1
    assert len(recording.prompts) == 4


async def test_prompts_that_do_not_continue_the_answered_context_go_whole(recording):
    servicer = InferenceServicer(recording)
    server = await serve(servicer)
    pool = InferencePool(InferencePoolConfig(), [server.address])
    first = prompt(80, seed=4)
    try:
        res = await pool(req(read_only(first), seed=1))
        edited = np.concatenate([first, res.token_ids, prompt(5, seed=9)])
        edited[40] = edited[40] + 1  # history rewritten: not a continuation
        await pool(req(read_only(edited), seed=2))
        assert recording.prompts[-1].tolist() == edited.tolist()
        # A writeable prompt is copied when sent: changing it afterwards cannot fake a continuation.
        mine = np.concatenate([edited, prompt(3, seed=5)]).astype(np.int32)
        res = await pool(req(mine, seed=3))
        mine[10] += 1
        longer = np.concatenate([mine, res.token_ids, prompt(5, seed=6)])
        await pool(req(longer, seed=4))
        assert recording.prompts[-1].tolist() == longer.tolist()
    finally:
        await pool.close()
        await server.stop()
    assert servicer.prompt_deltas == 0


def test_served_contexts_rebuild_prompts_check_bases_and_stay_within_their_token_budget():
    contexts = ServedContexts(max_tokens=25)
    contexts.remember("a", "r1", np.arange(8, dtype=np.int32), np.array([100, 101], np.int32))

    def delta(base: str, n: int, suffix: list[int], session: str = "a") -> pb.GenerateRequest:
        return pb.GenerateRequest(session_id=session, request_id="r2", prompt_delta=pb.PromptDelta(
            base_request_id=base, base_tokens=n, suffix_ids=common_pb2.Tensor(
                dtype="int32", shape=[len(suffix)], data=np.asarray(suffix, np.int32).tobytes())))

    assert contexts.full_prompt(delta("r1", 10, [7])).tolist() == [*range(8), 100, 101, 7]
    assert contexts.full_prompt(delta("r1", 3, [])).tolist() == [0, 1, 2]
    for bad in (delta("r0", 10, [7]), delta("r1", 11, [7]), delta("r1", 0, [7]), delta("r1", 5, [7], session="b")):
        with pytest.raises(BaseUnknown):
            contexts.full_prompt(bad)
    both = delta("r1", 10, [7])
    both.prompt_ids.CopyFrom(common_pb2.Tensor(dtype="int32", shape=[1], data=np.zeros(1, np.int32).tobytes()))
    with pytest.raises(RequestError, match="not both"):
        contexts.full_prompt(both)
    with pytest.raises(RequestError, match="prompt_ids: required"):
        contexts.full_prompt(pb.GenerateRequest(session_id="a"))
    contexts.remember("b", "q1", np.arange(12, dtype=np.int32), np.zeros(0, np.int32))  # 10 + 12 tokens
    contexts.remember("c", "p1", np.arange(6, dtype=np.int32), np.zeros(0, np.int32))   # over 25: "a" goes
    assert len(contexts) == 2
    with pytest.raises(BaseUnknown):
        contexts.full_prompt(delta("r1", 10, [7]))


async def test_a_delta_with_a_bad_suffix_is_invalid_argument_naming_the_field(recording):
    server = await serve(InferenceServicer(recording))
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            bad = pb.GenerateRequest(
                session_id="s",
                request_id="x",
                sampling=pb.SamplingParams(max_tokens=2),
                prompt_delta=pb.PromptDelta(
                    base_request_id="r",
                    base_tokens=1,
                    suffix_ids=common_pb2.Tensor(dtype="float32", shape=[1], data=b"\0\0\0\0"),
                ),
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Generate(bad):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "prompt_delta.suffix_ids" in err.value.details()
    finally:
        await server.stop()


async def test_deltas_follow_a_token_buffers_views_without_keeping_an_ended_episodes_ids(recording):
    from t1.tito.segment import SegmentBuilder

    servicer = InferenceServicer(recording)
    server = await serve(servicer)
    pool = InferencePool(InferencePoolConfig(), [server.address])
    seg = SegmentBuilder()
    seg.append_context(prompt(300, seed=7))
    try:
        for turn in range(3):
            res = await pool(req(seg.ids(), seed=turn, session="buffered"))
            assert recording.prompts[-1].tolist() == seg.ids().tolist()
            seg.append_context(res.token_ids)
            seg.append_context(prompt(500, seed=turn))  # the id array grows (and moves) along the way
        assert servicer.prompt_deltas >= 1
        flat = weakref.ref(seg._flat)
        del seg, res
        gc.collect()
        assert flat() is None  # the pool kept no reference to the ended buffer's ids
        await pool(req(prompt(400, seed=9), seed=5, session="buffered"))  # a new prompt: sent whole
        assert recording.prompts[-1].tolist() == prompt(400, seed=9).tolist()
    finally:
        await pool.close()
        await server.stop()
