"""Proto <-> dataclass conversion for InferenceService messages, on both sides of the wire."""

from __future__ import annotations

import numpy as np

from t1.inference.prompt_delta import ServedContexts
from t1.inference.types import (
    FinishReason,
    GenerateDone,
    GenerateRequest,
    GenerateResult,
    ModelInfo,
    SamplingParams,
    TokenChunk,
)
from t1.rpc.errors import RequestError
from t1.rpc.tensors import from_tensor, routing_from_proto, routing_to_proto, to_tensor
from t1.v1 import inference_pb2 as pb

_FINISH_TO_PB = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


def request_to_proto(req: GenerateRequest, request_id: str = "", delta: pb.PromptDelta | None = None
                     ) -> pb.GenerateRequest:
    """The request with its whole prompt, or with `delta` (t1.inference.prompt_delta) in its place."""
    s = req.sampling
    sampling = pb.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                 stop_token_ids=list(s.stop_token_ids), max_tokens=s.max_tokens)
    if s.seed is not None:
        sampling.seed = s.seed
    if delta is not None:
        return pb.GenerateRequest(session_id=req.session_id, prompt_delta=delta, sampling=sampling,
                                  return_routing=req.return_routing, request_id=request_id)
    return pb.GenerateRequest(session_id=req.session_id, prompt_ids=to_tensor(np.asarray(req.prompt_ids, np.int32)),
                              sampling=sampling, return_routing=req.return_routing, request_id=request_id)


def request_from_proto(msg: pb.GenerateRequest, contexts: ServedContexts | None = None) -> GenerateRequest:
    """Decode a request; a missing or malformed field raises RequestError/TensorError naming it.

    With `contexts` a prompt_delta is rebuilt on its session's served context (BaseUnknown when
    that is gone); without, only prompt_ids is read, as a server that predates deltas does."""
    if not msg.HasField("sampling"):
        raise RequestError("sampling: required (at least sampling.max_tokens)")
    if contexts is not None:
        ids = contexts.full_prompt(msg)
    elif msg.HasField("prompt_ids"):
        ids = from_tensor(msg.prompt_ids, "prompt_ids", dtype="int32", ndim=1)
    else:
        raise RequestError("prompt_ids: required")
    s = msg.sampling
    sampling = SamplingParams(
        temperature=float(s.temperature), top_p=float(s.top_p) if s.top_p > 0 else 1.0, top_k=int(s.top_k),
        seed=int(s.seed) if s.HasField("seed") else None, stop_token_ids=tuple(int(t) for t in s.stop_token_ids),
        max_tokens=int(s.max_tokens),
    )
    return GenerateRequest(session_id=msg.session_id, prompt_ids=ids, sampling=sampling,
                           return_routing=msg.return_routing)


def event_to_proto(event: TokenChunk | GenerateDone) -> pb.GenerateChunk:
    if isinstance(event, TokenChunk):
        return pb.GenerateChunk(tokens=pb.TokenChunk(
            token_ids=to_tensor(event.token_ids), logprobs=to_tensor(event.logprobs),
            policy_version=event.policy_version))
    done = pb.GenerateDone(
        finish_reason=_FINISH_TO_PB[event.finish_reason], policy_version=event.policy_version,
        prompt_tokens=event.prompt_tokens, cached_tokens=event.cached_tokens,
        completion_tokens=event.completion_tokens)
    if event.routing is not None:
        done.routing.CopyFrom(routing_to_proto(event.routing))
    return pb.GenerateChunk(done=done)


def event_from_proto(msg: pb.GenerateChunk) -> TokenChunk | GenerateDone:
    kind = msg.WhichOneof("payload")
    if kind == "tokens":
        t = msg.tokens
        return TokenChunk(from_tensor(t.token_ids, "tokens.token_ids", dtype="int32", ndim=1),
                          from_tensor(t.logprobs, "tokens.logprobs", dtype="float32", ndim=1), t.policy_version)
    if kind == "done":
        d = msg.done
        if d.finish_reason not in _FINISH_FROM_PB:
            raise ValueError(f"done.finish_reason: unknown value {d.finish_reason}")
        routing = routing_from_proto(d.routing, "done.routing") if d.HasField("routing") else None
        return GenerateDone(_FINISH_FROM_PB[d.finish_reason], d.policy_version, routing, d.prompt_tokens,
                            d.cached_tokens, d.completion_tokens)
    raise ValueError("GenerateChunk: empty payload")


def result_to_proto(request_id: str, result: GenerateResult) -> pb.GenerateResult:
    """A whole reply as GenerateBatched sends it."""
    done = pb.GenerateDone(
        finish_reason=_FINISH_TO_PB[result.finish_reason], policy_version=result.policy_version,
        prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
        completion_tokens=len(result.token_ids))
    if result.routing is not None:
        done.routing.CopyFrom(routing_to_proto(result.routing))
    return pb.GenerateResult(request_id=request_id, token_ids=to_tensor(result.token_ids),
                             logprobs=to_tensor(result.logprobs), token_versions=to_tensor(result.token_versions),
                             done=done)


def result_from_proto(msg: pb.GenerateResult) -> GenerateResult:
    """Decode a successful GenerateResult; a malformed field raises ValueError naming it."""
    ids = from_tensor(msg.token_ids, "token_ids", dtype="int32", ndim=1)
    logprobs = from_tensor(msg.logprobs, "logprobs", dtype="float32", ndim=1)
    versions = from_tensor(msg.token_versions, "token_versions", dtype="int32", ndim=1)
    if not len(ids) == len(logprobs) == len(versions):
        raise ValueError(f"token_ids, logprobs, token_versions: lengths differ ({len(ids)}, {len(logprobs)}, "
                         f"{len(versions)})")
    d = msg.done
    if d.finish_reason not in _FINISH_FROM_PB:
        raise ValueError(f"done.finish_reason: unknown value {d.finish_reason}")
    routing = routing_from_proto(d.routing, "done.routing") if d.HasField("routing") else None
    return GenerateResult(token_ids=ids, logprobs=logprobs, finish_reason=_FINISH_FROM_PB[d.finish_reason],
                          policy_version=d.policy_version, token_versions=versions, routing=routing,
                          prompt_tokens=d.prompt_tokens, cached_tokens=d.cached_tokens)


def info_to_proto(info: ModelInfo) -> pb.ModelInfo:
    return pb.ModelInfo(
        model_name=info.model_name, backend=info.backend, policy_version=info.policy_version,
        vocab_size=info.vocab_size, max_context_tokens=info.max_context_tokens,
        num_moe_layers=info.num_moe_layers, num_experts=info.num_experts, top_k=info.top_k,
        routing_dtype=info.routing_dtype, eos_token_ids=list(info.eos_token_ids),
        logprob_distribution=info.logprob_distribution, dtype=info.dtype)


def info_from_proto(msg: pb.ModelInfo) -> ModelInfo:
    return ModelInfo(msg.model_name, msg.backend, msg.policy_version, msg.vocab_size, msg.max_context_tokens,
                     msg.num_moe_layers, msg.num_experts, msg.top_k, msg.routing_dtype,
                     tuple(msg.eos_token_ids), msg.logprob_distribution, msg.dtype)
