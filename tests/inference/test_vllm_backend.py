"""The vLLM adapter against a stand-in engine with vLLM's structures: params, streaming, routing checks, reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import vllm_standin as vs
from inference_helpers import prompt

from t1.inference.routing_capture import MoeShape
from t1.inference.routing_check import check_routed_experts
from t1.inference.server.vllm_backend import VllmApi, VllmBackend
from t1.inference.types import FinishReason, GenerateRequest, SamplingParams, TokenChunk, collect
from t1.routing.block import sentinel
from t1.rpc.errors import RequestError

MOE = MoeShape(num_layers=3, num_experts=8, top_k=2)


@pytest.fixture
def engine() -> vs.StandInEngine:
    return vs.StandInEngine(vocab=1024, layers=3, experts=8, top_k=2, eos=2)


@pytest.fixture
def vllm(engine, tiny_model_dir: Path) -> VllmBackend:
    api = VllmApi(vs.SamplingParams, vs.TokensPrompt, vs.RequestOutputKind.DELTA)
    return VllmBackend(engine, tiny_model_dir, api, dtype="float32")


def req(ids: np.ndarray, session: str = "", **sampling) -> GenerateRequest:
    sampling.setdefault("seed", 4)
    sampling.setdefault("max_tokens", 12)
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(**sampling))


async def test_params_streaming_and_routing_follow_vllm(vllm, engine) -> None:
    p = prompt(40)
    res = await collect(vllm.stream(req(p, "s", temperature=0.7, top_k=20, stop_token_ids=(5,))))
    params = engine.params[-1]
    assert params.logprobs == 0 and params.output_kind is vs.RequestOutputKind.DELTA and params.detokenize is False
    assert (params.temperature, params.top_k, params.seed, params.stop_token_ids) == (0.7, 20, 4, [5])
    assert params.routed_experts_prompt_start == 0
    n = len(res.token_ids)
    assert res.logprobs.tolist() == pytest.approx([-0.5 - 0.01 * (i + 1) for i in range(n)])
    assert res.routing is not None and res.routing.start == 0
    np.testing.assert_array_equal(res.routing.experts, engine.routing_of(p.tolist() + res.token_ids[:-1].tolist()))
    info = vllm.model_info()
    assert (info.backend, info.num_moe_layers, info.num_experts, info.top_k, info.routing_dtype) == \
        ("vllm", 3, 8, 2, "uint8")
    assert info.logprob_distribution == "sampling" and info.eos_token_ids == (2, 0)


async def test_next_turn_asks_only_for_new_routing_rows(vllm, engine) -> None:
    p = prompt(40)
    first = await collect(vllm.stream(req(p, "s")))
    context = np.concatenate([p, first.token_ids, prompt(5, 1)])
    second = await collect(vllm.stream(req(context, "s")))
    known = len(p) + len(first.token_ids) - 1
    assert engine.params[-1].routed_experts_prompt_start == known
    assert second.routing is not None and second.routing.start == known
    assert second.routing.num_tokens == len(context) + len(second.token_ids) - 1 - known
    assert second.cached_tokens == known // 16 * 16  # vLLM's block-granular prefix cache hit
    full = engine.routing_of(context.tolist() + second.token_ids[:-1].tolist())
    np.testing.assert_array_equal(second.routing.experts, full[known:])


@pytest.mark.parametrize(("defect", "check"), [
    (lambda a: a[:-3], lambda b, d: d.missing_rows == 3 and b.missing_rows()[-3:].all()),
    (lambda a: np.where(np.arange(len(a))[:, None, None] == 1, 0, a).astype(np.uint8),
     lambda b, d: d.zero_records == 3 and b.missing_rows()[1].all() and not b.missing_rows()[0].any()),
    (lambda a: np.concatenate([a[:, :, :1], a[:, :, :1]], axis=-1),
     lambda b, d: d.duplicate_records + d.zero_records == b.num_tokens * 3 and b.missing_rows().all()),
    (lambda a: None, lambda b, d: d.missing_rows == b.num_tokens and b.missing_rows().all()),
    (lambda a: a[:, :2], lambda b, d: d.malformed and b.missing_rows().all()),
])
async def test_bad_engine_routing_is_marked_missing_and_counted(vllm, engine, defect, check) -> None:
    engine.defect = defect
    res = await collect(vllm.stream(req(prompt(30))))
    block = res.routing
    assert block is not None and block.num_tokens == 30 + len(res.token_ids) - 1
    _, defects = check_routed_experts(defect(engine.routing_of(list(range(block.num_tokens)))), 0,
                                      block.num_tokens, MOE)
    assert check(block, defects)
    assert sum(vllm.defects_total.values()) > 0


def test_engine_ignoring_the_prompt_start_is_realigned() -> None:
    full = np.stack([np.array([[i % 8, (i + 1) % 8]] * 3) for i in range(20)]).astype(np.uint8)
    block, defects = check_routed_experts(full, 12, 8, MOE)
    assert not defects.any and block.start == 12
    np.testing.assert_array_equal(block.experts, full[12:])
    block, defects = check_routed_experts(full.astype(np.int64) + 8, 0, 20, MOE)
    assert defects.out_of_range_records == 60 and (block.experts == sentinel(np.dtype("u1"))).all()


async def test_cancellation_aborts_the_engine_request(vllm, engine) -> None:
    engine.delay_s = 0.01
    stream = vllm.stream(req(prompt(20), max_tokens=500))
    assert isinstance(await anext(stream), TokenChunk)
    await stream.aclose()
    assert len(engine.aborted) == 1


async def test_update_weights_drains_running_requests_then_reloads(vllm, engine, tiny_model_dir) -> None:
    engine.delay_s = 0.005
    running = asyncio.create_task(collect(vllm.stream(req(prompt(20), max_tokens=30))))
    await asyncio.sleep(0.02)
    update = asyncio.create_task(vllm.update_weights(str(tiny_model_dir), 7))
    await asyncio.sleep(0.01)
    assert not update.done(), "reload waits for the running request"
    old = await running
    await update
    assert set(old.token_versions.tolist()) == {0} and old.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert engine.rpcs == [("reload_weights", {"weights_path": str(tiny_model_dir)}), ("t1_refresh_moe_kernels", {})]
    assert engine.prefix_resets == 1 and vllm.model_info().policy_version == 7
    new = await collect(vllm.stream(req(prompt(20))))
    assert set(new.token_versions.tolist()) == {7}
    with pytest.raises(RequestError, match="path"):
        await vllm.update_weights("/nonexistent", 8)


async def test_bad_request_is_rejected_before_the_engine(vllm, engine) -> None:
    with pytest.raises(RequestError, match="prompt_ids"):
        await collect(vllm.stream(req(np.zeros(0, np.int32))))
    assert engine.params == []


async def test_the_kv_cache_in_tokens_comes_from_vllms_stat_logger_and_admits_episodes(tiny_model_dir) -> None:
    """vLLM's cache (65 blocks of 16, one the null block: 1024 positions) through GetModelInfo over real
    gRPC, and the pool's KV admission on it: a second 600-position episode waits until the first ends."""
    from t1.config.inference import InferencePoolConfig
    from t1.config.shared import AuthConfig, ServerConfig
    from t1.inference.client.pool import InferencePool
    from t1.inference.server.servicer import inference_binding
    from t1.inference.server.vllm_backend import KvGauge
    from t1.rpc.client import make_channel
    from t1.rpc.server import GrpcServer
    from t1.v1 import inference_pb2 as pb
    from t1.v1.inference_pb2_grpc import InferenceServiceStub

    gauge = KvGauge()
    engine = vs.StandInEngine(vocab=1024, layers=3, experts=8, top_k=2, eos=2, delay_s=0.002, kv_blocks=65,
                              stat_loggers=[gauge.logger])
    backend = VllmBackend(engine, tiny_model_dir, VllmApi(vs.SamplingParams, vs.TokensPrompt,
                                                          vs.RequestOutputKind.DELTA), dtype="float32", kv=gauge)
    server = GrpcServer([inference_binding(backend)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    await server.start()
    stub = InferenceServiceStub(make_channel(server.address, AuthConfig()))
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert (info.kv_capacity_tokens, info.kv_used_tokens) == (1024, 0)

    stream = backend.stream(req(prompt(100), session="x", max_tokens=400))
    await anext(stream)  # 101 positions running: 7 blocks
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.kv_used_tokens == round(7 / 64 * 1024)
    await stream.aclose()
    assert backend.kv_usage() == (1024, 0)

    pool = InferencePool(InferencePoolConfig(kv_admission=True, kv_expected_context_tokens=600, backoff_s=0.01),
                         [server.address])
    await pool(req(prompt(100, seed=1), session="a", max_tokens=4))
    second = asyncio.create_task(pool(req(prompt(100, seed=2), session="b", max_tokens=4)))
    await asyncio.sleep(0.7)
    assert not second.done() and pool.kv_usage()[server.address][0] == 1024  # 600 + 600 > 1024
    pool.end_session("a")
    assert len((await asyncio.wait_for(second, 30)).token_ids) >= 1
    await pool.close()
    await server.stop()
