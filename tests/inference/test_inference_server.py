"""InferenceService over real gRPC on 127.0.0.1: streaming, errors naming fields, model info, health, weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference_helpers import prompt

from t1.config.inference import InferencePoolConfig
from t1.inference.client.pool import InferencePool
from t1.inference.convert import request_to_proto
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.client import make_channel
from t1.rpc.introspect import list_services
from t1.rpc.tensors import to_tensor
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc


def req(ids: np.ndarray, session: str = "", **sampling) -> GenerateRequest:
    sampling.setdefault("seed", 5)
    sampling.setdefault("max_tokens", 10)
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(**sampling))


async def test_generate_streams_chunks_then_done_equal_to_in_process(served, backend) -> None:
    p = prompt(25)
    local = await backend(req(p))
    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        chunks = [c async for c in stub.Generate(request_to_proto(req(p)), timeout=30)]
    kinds = [c.WhichOneof("payload") for c in chunks]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"tokens"} and len(kinds) >= 3  # chunk_tokens=4
    pool = InferencePool(InferencePoolConfig(), [served])
    remote = await pool(req(p))
    await pool.close()
    assert remote.token_ids.tolist() == local.token_ids.tolist()
    np.testing.assert_array_equal(remote.logprobs, local.logprobs)
    assert remote.routing is not None and local.routing is not None
    np.testing.assert_array_equal(remote.routing.experts, local.routing.experts)
    assert remote.prompt_tokens == 25 and remote.cached_tokens == 0


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda m: m.prompt_ids.CopyFrom(to_tensor(np.zeros(0, np.int32))), "prompt_ids"),
    (lambda m: m.prompt_ids.CopyFrom(to_tensor(np.array([3, 99999], np.int32))), "prompt_ids"),
    (lambda m: m.prompt_ids.CopyFrom(to_tensor(np.array([3, 4], np.int64))), "prompt_ids"),
    (lambda m: m.ClearField("prompt_ids"), "prompt_ids"),
    (lambda m: setattr(m.sampling, "max_tokens", 100_000), "sampling.max_tokens"),
    (lambda m: setattr(m.sampling, "top_k", -3), "sampling.top_k"),
])
async def test_bad_requests_are_invalid_argument_naming_the_field(served, mutate, field) -> None:
    msg = request_to_proto(req(prompt(8)))
    mutate(msg)
    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [c async for c in stub.Generate(msg, timeout=30)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


async def test_model_info_and_health(served) -> None:
    async with make_channel(served) as channel:
        info = await inference_pb2_grpc.InferenceServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                                   timeout=10)
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="t1.v1.InferenceService"), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert "t1.v1.InferenceService" in await asyncio.to_thread(list_services, served)
    assert (info.backend, info.vocab_size, info.num_moe_layers, info.num_experts, info.top_k) == (
        "torch",
        1024,
        3,
        8,
        2,
    )
    assert info.routing_dtype == "uint8" and info.logprob_distribution == "sampling" and info.dtype == "float32"
    assert list(info.eos_token_ids) == [2, 0]


async def test_client_going_away_cancels_the_request(served, backend) -> None:
    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        call = stub.Generate(request_to_proto(req(prompt(20), "gone", max_tokens=4000)), timeout=30)
        first = await call.read()
        assert first.WhichOneof("payload") == "tokens"
        call.cancel()
    await asyncio.sleep(0.5)
    steps = backend.num_steps
    await asyncio.sleep(0.5)
    assert backend.num_steps == steps, "generation went on after the client left"
    assert steps < 1000
    res = await backend(req(prompt(20), "gone", max_tokens=3))
    assert res.cached_tokens == 0


async def test_update_weights_rpc(served, tmp_path: Path) -> None:
    from t1.model.init import init_model

    other = init_model(tmp_path / "v3", "tiny", seed=3)
    pool = InferencePool(InferencePoolConfig(), [served])
    update = await pool.update_weights(str(other), 3)
    assert (update.version, update.updated, update.skipped) == (3, (served,), ())
    res = await pool(req(prompt(10)))
    assert res.policy_version == 3 and set(res.token_versions.tolist()) == {3}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pool.update_weights(str(tmp_path / "nope"), 4)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "path" in err.value.details()
    assert pool.latest_weights == (str(other), 3), "a refused folder is not what recovering replicas load"
    await pool.close()
