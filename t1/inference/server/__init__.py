"""The server side of InferenceService: the gRPC servicer and the backends it serves (torch, vLLM).

- servicer.py: the InferenceService servicer: streams a backend's chunks, reports model info, loads new
  weights; `t1-inference` (t1/cli/inference.py) serves it.
- factory.py: build the configured backend (imports torch or vLLM only there, after the config is valid).
- torch_backend.py: `TorchBackend`, transformers model, KV-cache decoding, sampling, routing capture,
  per-session prefix reuse, atomic weight swaps.
- sampling.py: token sampling and the logprob PPO needs, both from the distribution actually sampled from.
- batching.py: decode batching: sessions in the decode phase share one forward, whatever their cache lengths.
- kv_slots.py: persistent per-session KV slots: every session's cache is one row of a shared buffer.
- slot_batch.py: the cache of one batched decode forward over sessions' KV slots.
- validate.py: a generate request checked against the model; each error names the field.
- vllm_backend.py: `VllmBackend`, a thin adapter over vLLM 0.32 AsyncLLM; its KV cache in tokens from
  vLLM's stat logger (`KvGauge`).
- vllm_worker.py: the vLLM worker extension (`worker_extension_cls`) the vLLM backend calls after a reload.
"""
