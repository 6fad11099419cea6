"""Build the configured backend (imports torch or vLLM only here, after the config is valid)."""

from __future__ import annotations

from t1.config.inference import InferenceConfig
from t1.inference.types import Backend


def make_backend(cfg: InferenceConfig) -> Backend:
    server = cfg.server
    if server.backend == "torch":
        import torch

        from t1.inference.server.torch_backend import TorchBackend

        if server.num_threads:
            torch.set_num_threads(server.num_threads)
        return TorchBackend(cfg.model.path, dtype=server.dtype, device=server.device,
                            capture_routing=server.capture_routing, session_cache_mb=server.session_cache_mb,
                            chunk_tokens=server.stream_chunk_tokens, prefill_chunk=server.prefill_chunk_tokens,
                            max_batch=server.max_batch)
    from t1.inference.server.vllm_backend import VllmBackend

    return VllmBackend.from_config(cfg)
