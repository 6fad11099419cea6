"""Issue 19 case 8: UpdateWeights refuses a negative version by name; a garbage body is INVALID_ARGUMENT."""

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
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "version: must be >= 0" in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/t1.v1.InferenceService/UpdateWeights")(b"\xff\xff\xff", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info_now = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert info_now.policy_version == 0, "nothing was loaded"
