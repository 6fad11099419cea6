"""The simulated inference server follows the Generate contract over real gRPC on 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import numpy as np
import pytest
from tokenizers import Tokenizer

from bench.sim_inference import Latency, SimInferenceServicer, binding, cached_prefix
from bench.sim_replies import CommandMix, ModelShape, ReplyBook, ReplySettings
from t1.config.shared import AuthConfig, ServerConfig
from t1.rpc.client import make_channel
from t1.rpc.server import GrpcServer
from t1.rpc.tensors import from_tensor, routing_from_proto, to_tensor
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc as pb_grpc

FAST = Latency(per_request_s=0.0, per_prefill_token_s=0.0, per_token_s=0.0, chunk_tokens=32)


async def _generate(stub, session: str, prompt: np.ndarray, max_tokens: int = 0):
    ids, lps, done = [], [], None
    call = stub.Generate(pb.GenerateRequest(session_id=session, prompt_ids=to_tensor(prompt),
                                            sampling=pb.SamplingParams(max_tokens=max_tokens), return_routing=True),
                         timeout=10)
    async for chunk in call:
        if chunk.HasField("tokens"):
            ids.append(from_tensor(chunk.tokens.token_ids, "ids"))
            lps.append(from_tensor(chunk.tokens.logprobs, "lps"))
        else:
            done = chunk.done
    assert done is not None
    return np.concatenate(ids), np.concatenate(lps), done


@pytest.fixture
async def sim(tiny_model_dir: Path):
    book = ReplyBook(tiny_model_dir / "tokenizer.json", ReplySettings(50, 400, CommandMix.BASH))
    servicer = SimInferenceServicer(book, ModelShape(vocab_size=book.vocab_size), FAST, seed=3)
    server = GrpcServer([binding(servicer)], ServerConfig(port=0), AuthConfig())
    port = await server.start()
    channel = make_channel(f"127.0.0.1:{port}")
    yield pb_grpc.InferenceServiceStub(channel), book, Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    await channel.close()
    await server.stop(0)


async def test_turns_follow_the_cache_and_routing_contract(sim) -> None:
    stub, book, tok = sim
    prompt = np.arange(10, 130, dtype=np.int32)
    ids, lps, done = await _generate(stub, "s1", prompt)
    assert 50 <= len(ids) <= 400 and len(lps) == len(ids) and np.all(lps <= 0)
    assert ids[-1] == book.eos_id and done.finish_reason == pb.FINISH_REASON_STOP
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    call = json.loads(re.search(r"<tool_call>\n(.*)\n</tool_call>", text, re.S).group(1))
    assert call["name"] == "bash" and call["arguments"]["command"] in book.commands
    routing = routing_from_proto(done.routing)
    assert routing.start == 0 and routing.experts.shape == (len(prompt) + len(ids) - 1, 48, 8)
    assert routing.experts.dtype == np.uint8
    assert all(len(set(row)) == 8 for row in routing.experts[:20].reshape(-1, 8).tolist())
    assert done.cached_tokens == 0 and done.prompt_tokens == len(prompt)

    # Next turn extends the context: everything but the last sampled token was processed before.
    nxt = np.concatenate([prompt, ids, np.arange(200, 240, dtype=np.int32)])
    ids2, _, done2 = await _generate(stub, "s1", nxt)
    assert done2.cached_tokens == len(prompt) + len(ids) - 1
    routing2 = routing_from_proto(done2.routing)
    assert routing2.start == done2.cached_tokens
    assert routing2.end == len(nxt) + len(ids2) - 1

    # Another session has no cache; a diverging prompt is cached only up to the divergence.
    _, _, other = await _generate(stub, "s2", nxt)
    assert other.cached_tokens == 0
    forked = nxt.copy()
    forked[50] = 7
    _, _, fork = await _generate(stub, "s1", forked)
    assert fork.cached_tokens == 50


async def test_max_tokens_cuts_the_reply(sim) -> None:
    stub, _, _ = sim
    ids, _, done = await _generate(stub, "s", np.arange(1, 20, dtype=np.int32), max_tokens=5)
    assert len(ids) == 5 and done.finish_reason == pb.FINISH_REASON_LENGTH


async def test_bad_prompt_is_invalid_argument(sim) -> None:
    stub, _, _ = sim
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _generate(stub, "s", np.arange(0, 5, dtype=np.int64))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_ids" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _generate(stub, "", np.arange(0, 5, dtype=np.int32))
    assert "session_id" in err.value.details()


def test_cached_prefix_keeps_one_position_to_process() -> None:
    ctx = np.arange(10, dtype=np.int32)
    assert cached_prefix(ctx, None) == 0
    assert cached_prefix(ctx, ctx) == 9
    assert cached_prefix(ctx[:5], ctx) == 4
    assert cached_prefix(np.arange(12, dtype=np.int32), ctx) == 10
