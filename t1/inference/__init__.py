"""The inference plane: InferenceService backends (torch, vllm), the gRPC servicer, and the client pool.

Modules, from the seam outwards:
- types.py: GenerateRequest / GenerateResult / GenerateFn, the streamed TokenChunk / GenerateDone,
  ModelInfo and the Backend protocol; `collect` folds a stream into a result.
- torch_backend.py: `TorchBackend`, transformers model, KV-cache decoding, sampling (sampling.py),
  routing capture (routing_capture.py), per-session prefix reuse (sessions.py), atomic weight swaps;
  decode batching (batching.py) over persistent per-session KV slots (kv_slots.py).
- vllm_backend.py: `VllmBackend`, thin adapter over vLLM 0.32 AsyncLLM; routing validated by
  routing_check.py; its KV cache in tokens from vLLM's stat logger (`KvGauge`).
- server.py: the InferenceService servicer; factory.py builds the configured backend;
  `t1-inference` (t1/cli/inference.py) serves it.
- replicas.py: `ReplicaSet`, what both client pools are: replicas over a `Transport` (one per replica), their
  health, affinity (affinity.py), least-outstanding placement, KV-headroom admission (kv_admission.py),
  retries and failover, weight updates that skip avoided replicas and catch recovered ones up before
  routing to them, metrics; pool_common.py: PoolMetrics (and `observe`), WeightsUpdate, InferenceUnavailable.
- pool.py: `InferencePool`, the replica set over T1's gRPC servers (grpc_transport.py: many requests over one
  stream, multiplex.py; weight loads pushed or followed, follow.py), with prompt deltas (prompt_delta.py)
  and stalled replicas (stall.py, driven by stall_guard.py).
- convert.py: proto <-> dataclass for InferenceService messages; validate.py: a request checked against
  the model; model_config.py: what a model folder says about itself, read without torch.
- slot_batch.py: the cache of one batched decode forward over KV slots; follow.py: a server that loads
  each new weight version itself; vllm_worker.py: the vLLM worker extension called after a reload.
- openai_pool.py: `OpenAIPool`, the replica set over OpenAI-compatible HTTP servers (openai_transport.py: an
  endpoint's client, slots, retryable replies and weight reloads on vLLM, openai_weights.py), with request
  bodies and reply checks (openai_wire.py), bounded reply reading (openai_reply.py) and chat messages
  (openai_messages.py).

In-process use (the same code path as the server; e.g. for fidelity benches)::

    backend = TorchBackend(model_dir, dtype="float32", capture_routing=True)
    result = await backend.generate(GenerateRequest("session-1", prompt_ids_int32,
                                                    SamplingParams(temperature=1.0, seed=0, max_tokens=64)))
    # result.token_ids, result.logprobs, result.routing (RoutingBlock), result.cached_tokens
    await backend.close()

`backend`, `InferencePool` and a completions `OpenAIPool` are all GenerateFn (`await fn(request)`).

Semantics every backend keeps:
- Logprobs are taken from the distribution actually sampled from: softmax(logits / temperature)
  restricted to top_k then the top_p nucleus, renormalised (ModelInfo.logprob_distribution =
  "sampling"), the behaviour policy of the PPO ratio. With temperature 0 (greedy) the raw
  distribution's logprob is returned.
- Routing: a RoutingBlock for positions start .. prompt_len + n - 2, where start is the first
  position the request processed for the first time (cached_tokens for the torch backend). The
  last sampled token has no row: it is first fed in the next request (docs/design.md).
- cached_tokens: prompt tokens served from the session cache; the rest were prefilled.
- A request runs to its end on the weights it started with; every TokenChunk carries the version.
- EOS ids (generation_config.json) and stop_token_ids end a turn; the stop token is the last token.

Scheduling in the torch backend: concurrent requests advance in fair FIFO order, one model step
at a time: a prefill chunk (prefill_chunk_tokens) of one session, or one decode token for a batch
of up to max_batch sessions of one weight version, whatever their cache lengths (batching.py). A
session's cache is a slot of its weight version's KV slots (kv_slots.py), written in place: a
decode batch attends each row to its own length under a padding mask, at its own position.
"""
