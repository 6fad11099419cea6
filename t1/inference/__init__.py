"""The inference plane: InferenceService backends (torch, vllm), the gRPC servicer, and the client pool.

Modules, from the seam outwards:
- types.py: GenerateRequest / GenerateResult / GenerateFn, the streamed TokenChunk / GenerateDone,
  ModelInfo and the Backend protocol; `collect` folds a stream into a result.
- server/: the InferenceService servicer and its backends: `TorchBackend` (transformers, KV-cache decoding,
  sampling, decode batching over persistent per-session KV slots, atomic weight swaps) and `VllmBackend`
  (a thin adapter over vLLM 0.32 AsyncLLM); its factory builds the configured one.
- client/: `ReplicaSet`, what both client pools are (health, affinity, least-outstanding placement,
  KV-headroom admission, retries and failover, weight updates, metrics), and `InferencePool`, the replica set
  over T1's gRPC servers, with stalled replicas taken out.
- openai/: `OpenAIPool`, the replica set over OpenAI-compatible HTTP servers (request bodies and reply
  checks, bounded reply reading, chat messages, weight reloads on vLLM).

Shared by both sides:
- convert.py: proto <-> dataclass for InferenceService messages.
- multiplex.py: GenerateBatched on both ends: many generate requests over one long-lived gRPC stream.
- prompt_delta.py: a turn sends the ids it adds to its session's context (SentContexts, ServedContexts).
- follow.py: a server that loads each new weight version itself (`TrainerFollower`), and `await_served`,
  with which the gRPC transport waits for it.
- sessions.py: per-session KV caches (an LRU bounded by memory) and the prefix match that decides what
  to prefill.
- routing_capture.py: forward hooks that record the experts a transformers MoE model's routers select;
  `MoeShape`.
- routing_check.py: routed-expert arrays from an engine validated before they become a RoutingBlock.
- model_config.py: what a model folder says about itself, read without torch.

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
