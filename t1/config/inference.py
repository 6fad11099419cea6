"""Config of the inference plane: servers, backends and the client pool."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from t1.config.base import Section
from t1.config.service import ServerConfig


class ModelConfig(Section):
    """The policy model folder, created locally when asked."""

    path: Path = Field(Path(".t1/models/tiny"), description="Hugging Face model folder.")
    init_preset: Literal["tiny", "small", "learn"] | None = Field(
        "tiny", description="If the folder is missing, create a random-init model of this preset; null forbids."
    )
    init_seed: int = Field(0, description="Seed for model creation.")


class InferenceServerConfig(Section):
    """One t1-inference process (the server side)."""

    backend: Literal["torch", "vllm"] = Field("torch", description="Generation backend.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and compute dtype.")
    device: str = Field("cpu", description="torch device for the torch backend.")
    max_batch: int = Field(8, ge=1, description="Most sessions decoded together in one batch.")
    session_cache_mb: int = Field(512, ge=0, description="Memory bound of the per-session KV-cache LRU.")
    capture_routing: bool = Field(True, description="Record MoE routing for every processed position.")
    num_threads: int = Field(0, ge=0, description="torch intra-op threads for the torch backend; 0 keeps torch's default.")
    stream_chunk_tokens: int = Field(16, ge=1, description="Sampled tokens per streamed TokenChunk.")
    prefill_chunk_tokens: int = Field(1024, ge=1, description="Most prompt tokens prefilled in one model step (torch backend).")
    batch_linger_ms: float = Field(
        0.0, ge=0, le=1000, description="GenerateBatched: wait this long before replying, so more results share a message.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="Where the server listens.")
    vllm_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra vLLM engine arguments (vllm backend only)."
    )


class InferencePoolConfig(Section):
    """The client side: endpoints, retries and deadlines."""

    endpoints: list[str] = Field(default_factory=list, description="host:port of inference servers; empty means the local ones.")
    num_local_servers: int = Field(1, ge=0, description="Servers the local run starts itself.")
    request_timeout_s: float = Field(300.0, gt=0, description="Deadline of one Generate call.")
    retries: int = Field(3, ge=0, description="Retries on UNAVAILABLE or DEADLINE_EXCEEDED.")
    backoff_s: float = Field(0.5, ge=0, description="First retry backoff; doubles per retry.")
    unhealthy_s: float = Field(10.0, ge=0, description="How long a failed replica is avoided.")
    batched_stream: bool = Field(
        True, description="One GenerateBatched stream per replica carries every request (false: a Generate call each).")
    batch_linger_ms: float = Field(
        0.0, ge=0, le=1000, description="GenerateBatched: wait this long before sending, so more requests share a message.")
    prompt_deltas: bool = Field(
        True, description="A turn that continues its session's last answered context sends only its new ids.")
    weights_timeout_s: float = Field(600.0, gt=0, description="Deadline of loading new weights on one replica.")
    probe_timeout_s: float = Field(5.0, gt=0, description="Deadline of asking a replica of unknown state its version.")


class InferenceConfig(Section):
    """Inference servers and the pool that reaches them."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    server: InferenceServerConfig = Field(default_factory=InferenceServerConfig, description="Server settings.")
    pool: InferencePoolConfig = Field(default_factory=InferencePoolConfig, description="Client pool settings.")
