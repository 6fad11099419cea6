"""Issue 19 case 8: UpdateWeights refuses a negative version (and one past int32) by name, a garbage body is
INVALID_ARGUMENT, the served version is a no-op, an older one needs `rollback`, and a following server refuses it."""

from __future__ import annotations

import grpc
import pytest

from t1.rpc.client import make_channel
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc


async def test_update_weights_refuses_negative_versions(served: str, tiny_model_dir: object) -> None:
    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UpdateWeights(pb.UpdateWeightsRequest(path=str(tiny_model_dir), version=-4), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and ("version: must be in "
                                                                          "[0, ") in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:  # would make every honest version after it "older"
            await stub.UpdateWeights(pb.UpdateWeightsRequest(path=str(tiny_model_dir), version=2**62), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"version: must be in [0, {2**31 - 1}], got {2**62}" in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/t1.v1.InferenceService/UpdateWeights")(b"\xff\xff\xff", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info_now = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert info_now.policy_version == 0, "nothing was loaded"


async def test_same_version_is_a_no_op_and_older_needs_rollback(served: str, tiny_model_dir: object) -> None:
    """Issue 19 case 8 / issue 22: a version is loaded once however many callers send it; going back is refused
    by name unless the request says rollback."""
    import asyncio

    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        path = str(tiny_model_dir)
        first, second = await asyncio.gather(  # two coordinators racing to load v3: one load
            stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=3), timeout=60),
            stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=3), timeout=60))
        assert sorted([first.loaded, second.loaded]) == [False, True]
        assert first.policy_version == second.policy_version == 3
        again = await stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=3), timeout=60)
        assert (again.loaded, again.load_seconds, again.policy_version) == (False, 0.0, 3)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=2), timeout=60)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "2 is older than the served version 3" in info.value.details()
        assert (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)).weight_loads == 1
        back = await stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=2, rollback=True), timeout=60)
        assert (back.loaded, back.policy_version) == (True, 2)
        info_now = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (info_now.policy_version, info_now.weight_loads) == (2, 2)


async def test_pool_counts_a_server_already_past_the_version_as_updated(served: str, tiny_model_dir: object) -> None:
    """A coordinator that restarted replays old versions; a server another party moved on is not an error."""
    from t1.config.inference import InferencePoolConfig
    from t1.inference.client.pool import InferencePool

    async with make_channel(served) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await stub.UpdateWeights(pb.UpdateWeightsRequest(path=str(tiny_model_dir), version=5), timeout=60)
    pool = InferencePool(InferencePoolConfig(), [served])
    try:
        update = await pool.update_weights(str(tiny_model_dir), 4)
        assert update.updated == (served,) and pool.latest_weights == (str(tiny_model_dir), 4)
        with pytest.raises(grpc.aio.AioRpcError) as info:  # a refused folder still fails by name
            await pool.update_weights("/nonexistent", 6)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await pool.close()


async def test_a_following_server_refuses_update_weights(backend, tiny_model_dir: object) -> None:
    """A server that follows a trainer takes its versions from there only: a client without a token cannot move it
    to a version that locks it out of the trainer's (UpdateWeights(version=2**31 - 1) was such a lock)."""
    from t1.config.shared import AuthConfig, ServerConfig
    from t1.inference.server.servicer import InferenceServicer, inference_binding
    from t1.rpc.server import GrpcServer

    servicer = InferenceServicer(backend)
    servicer.follows = "127.0.0.1:50061"
    server = GrpcServer([inference_binding(backend, servicer=servicer)], ServerConfig(host="127.0.0.1", port=0),
                        AuthConfig())
    await server.start()
    try:
        async with make_channel(server.address) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.UpdateWeights(pb.UpdateWeightsRequest(path=str(tiny_model_dir), version=2**31 - 1),
                                         timeout=30)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "follows the trainer at 127.0.0.1:50061" in info.value.details()
            assert (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)).policy_version == 0
    finally:
        await server.stop(0)
