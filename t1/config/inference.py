"""Config of the inference plane: servers, backends and the client pool."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from t1.config.base import Section
from t1.config.shared import ServerConfig, host_port


class ModelConfig(Section):
    """The policy model folder, created locally when asked."""

    path: Path = Field(Path(".t1/models/tiny"), description="Hugging Face model folder.")
    init_preset: Literal["tiny", "small", "learn", "learn-long", "qwen3-vocab"] | None = Field(
        "tiny", description="If the folder is missing, create a random-init model of this preset; null forbids."
    )
    init_seed: int = Field(0, description="Seed for model creation.")
    chat_template_kwargs: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Variables for the model's chat template, e.g. {enable_thinking: false} "
                                          "for Qwen3 with thinking off.")


class WeightsMode(StrEnum):
    """Who makes an inference server load a new weight version."""

    PUSH = "push"
    FOLLOW = "follow"


class InferenceServerConfig(Section):
    """One t1-inference process (the server side)."""

    backend: Literal["torch", "vllm"] = Field("torch", description="Generation backend.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and compute dtype.")
    device: str = Field("cpu", description="torch device for the torch backend.")
    max_batch: int = Field(8, ge=1, description="Most sessions decoded together in one forward (torch: of any cache "
                                                "lengths; vllm: max_num_seqs).")
    session_cache_mb: int = Field(512, ge=0, description="Memory bound of the per-session KV-cache LRU.")
    capture_routing: bool = Field(True, description="Record MoE routing for every processed position.")
    num_threads: int = Field(0, ge=0, description="torch intra-op threads for the torch backend; 0 keeps torch's "
                                                  "default (every core); on a shared 2-core machine 1 is faster "
                                                  "(bench/decode_batching.py).")
    stream_chunk_tokens: int = Field(16, ge=1, description="Sampled tokens per streamed TokenChunk.")
    prefill_chunk_tokens: int = Field(1024, ge=1, description="Most prompt tokens prefilled in one model step (torch "
                                                              "backend).")
    batch_linger_ms: float = Field(
        0.0, ge=0, le=1000, description="GenerateBatched: wait this long before replying, so more results share a "
                                        "message.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="Where the server listens.")
    follow_trainer: str = Field(
        "", description="host:port of the trainer whose new weight versions this server loads itself (empty: "
                        "versions are pushed to it with UpdateWeights).")
    vllm_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra vLLM engine arguments (vllm backend only)."
    )

    @field_validator("follow_trainer")
    @classmethod
    def _trainer_address(cls, value: str) -> str:
        return host_port(value) if value else value


class OpenAIEndpointConfig(Section):
    """One OpenAI-compatible server (vLLM's or SGLang's `serve`, a hosted API) beside T1's own gRPC servers."""

    base_url: str = Field(..., description="Root of the API, e.g. http://127.0.0.1:8000/v1 (http or https).")
    model: str = Field(..., min_length=1, description="The served model's name (each request's `model`).")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions: token ids in, sampled ids and logprobs out (TITO, training); "
                                   "chat: messages in, text out (eval only, results are text-level).")
    api_key_env: str = Field("", description="Environment variable holding the API key (a Bearer token); empty: none.")
    max_concurrency: int = Field(64, ge=1, description="Most requests in flight on this endpoint.")
    kv_budget_tokens: int = Field(
        0, ge=0, description="inference.pool.kv_admission: the KV cache, in tokens, T1's sessions may hold on this "
                             "endpoint, counted by the pool from the prompts it sends and the replies it gets "
                             "(completions; 0: no bound).")
    connect_timeout_s: float = Field(10.0, gt=0, description="Deadline of opening a connection.")
    request_timeout_s: float = Field(300.0, gt=0, description="Deadline of one request (reading the whole reply).")
    max_retry_after_s: float = Field(
        60.0, ge=0, description="Longest wait a 429's retry-after may ask before the next attempt.")
    tool_calls: bool = Field(False, description="chat: send the format's tools and read the reply's tool_calls "
                                                "(vLLM: --enable-auto-tool-choice with a tool-call parser).")
    weight_updates: Literal["none", "vllm_dev"] = Field(
        "none", description="How new weights reach it: vllm_dev reloads a weights folder through vLLM's dev-mode "
                            "endpoints (VLLM_SERVER_DEV_MODE=1); none: training against it is refused.")
    t1_worker_extension: bool = Field(
        True, description="vllm_dev: the server runs --worker-extension-cls "
                          "t1.inference.server.vllm_worker.T1WorkerExtension and is asked to refresh its CPU MoE "
                          "kernels after a reload.")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class InferencePoolConfig(Section):
    """The client side: endpoints, retries and deadlines."""

    endpoints: list[str] = Field(default_factory=list, description="host:port of inference servers; empty means the "
                                                                   "local ones.")
    num_local_servers: int = Field(1, ge=0, description="Servers the local run starts itself.")
    request_timeout_s: float = Field(300.0, gt=0, description="Deadline of one Generate call.")
    retries: int = Field(3, ge=0, description="Retries on UNAVAILABLE or DEADLINE_EXCEEDED.")
    backoff_s: float = Field(0.5, ge=0, description="First retry backoff; doubles per retry.")
    unhealthy_s: float = Field(10.0, ge=0, description="How long a failed replica is avoided.")
    batched_stream: bool = Field(
        True, description="One GenerateBatched stream per replica carries every request (false: a Generate call each).")
    batch_linger_ms: float = Field(
        0.0, ge=0, le=1000, description="GenerateBatched: wait this long before sending, so more requests share a "
                                        "message.")
    prompt_deltas: bool = Field(
        True, description="A turn that continues its session's last answered context sends only its new ids.")
    weights_timeout_s: float = Field(600.0, gt=0, description="Deadline of loading new weights on one replica.")
    probe_timeout_s: float = Field(5.0, gt=0, description="Deadline of asking a replica of unknown state its version.")
    stall_s: float = Field(
        120.0, ge=0, description="A replica that completes no token for this long while it runs requests (or does not "
                                 "answer a probe while busy) is stalled: avoided, its requests retried on other "
                                 "replicas; a weight load running past weights_timeout_s is too (0: no stall watch).")
    kv_admission: bool = Field(
        False, description="A new episode starts only on a replica with room in the KV capacity it reports (gRPC "
                           "servers) or is given (kv_budget_tokens of an OpenAI endpoint) for what it is expected "
                           "to grow to, else waits; resident sessions' turns always start (docs/inference.md). "
                           "Callers must end their sessions (end_session).")
    kv_expected_context_tokens: int = Field(
        0, ge=0, description="kv_admission: the prior of the context an episode grows to, learned from ended "
                             "episodes (the prior weighs as four of them); 0: the model's context limit, capped at "
                             "the replica's capacity.")
    stall_check_s: float = Field(2.0, gt=0, description="How often the stall watch asks busy replicas for their "
                                                        "progress.")
    weights: WeightsMode = Field(
        WeightsMode.PUSH, description="push: this coordinator makes its servers load each version (one coordinator); "
                                      "follow: the servers follow the trainer (inference.server.follow_trainer) and "
                                      "the coordinator waits until they serve it (several coordinators).")
    openai: list[OpenAIEndpointConfig] = Field(
        default_factory=list, description="OpenAI-compatible endpoints instead of T1's gRPC servers (see "
                                          "docs/endpoints.md).")

    @field_validator("endpoints")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        return [host_port(v) for v in value]

    @model_validator(mode="after")
    def _one_kind(self) -> InferencePoolConfig:
        if self.openai and self.endpoints:
            raise ValueError("endpoints and openai: a pool is either T1's gRPC servers or OpenAI-compatible ones")
        if len({e.api for e in self.openai}) > 1:
            raise ValueError("openai: every endpoint of a pool uses the same api (completions or chat)")
        return self


class InferenceConfig(Section):
    """Inference servers and the pool that reaches them."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    server: InferenceServerConfig = Field(default_factory=InferenceServerConfig, description="Server settings.")
    pool: InferencePoolConfig = Field(default_factory=InferencePoolConfig, description="Client pool settings.")
