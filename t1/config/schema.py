"""The one typed config schema of every T1 process; imports without torch."""

from __future__ import annotations

from pydantic import Field, model_validator

from t1.config.base import Section
from t1.config.coordinator import CoordinatorConfig
from t1.config.inference import InferenceConfig
from t1.config.limits import RequestLimits
from t1.config.rollout import RolloutConfig
from t1.config.sandbox import SandboxConfig
from t1.config.shared import AuthConfig, LoggingConfig, MetricsConfig
from t1.config.tasks import RewardConfig, TasksConfig
from t1.config.trainer import TrainerConfig


class T1Config(Section):
    """Root of a T1 config file."""

    name: str = Field("t1", description="Run name, used in logs and metrics.")
    seed: int = Field(0, description="Global seed.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Sandbox plane.")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="Task sets.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Episodes.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference plane.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer service.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rewards.")
    coordinator: CoordinatorConfig = Field(default_factory=CoordinatorConfig, description="Coordinator.")
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Auth and TLS.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Logging.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Metrics.")
    limits: RequestLimits = Field(default_factory=RequestLimits, description="Bounds on request fields.")

    @model_validator(mode="after")
    def _trainer_can_score_the_sampler(self) -> T1Config:
        # The trainer scores softmax(logits / temperature); truncated sampling would make every
        # behaviour logprob differ from it by -log(kept mass), so training refuses it.
        sampling = self.rollout.sampling
        if self.coordinator.train and (sampling.top_p < 1.0 or sampling.top_k > 0):
            raise ValueError(
                "rollout.sampling: top_p must be 1.0 and top_k 0 when coordinator.train is true "
                "(the trainer's importance ratio uses the temperature-only distribution)"
            )
        return self

    @model_validator(mode="after")
    def _harness_samples_as_the_trainer_scores(self) -> T1Config:
        if self.coordinator.train and self.rollout.harness.command and self.rollout.harness.sampling.honour != "run":
            raise ValueError("rollout.harness.sampling.honour must be 'run' when coordinator.train is true (a "
                             "harness's own temperature or top_p would make its behaviour logprobs differ from "
                             "what the trainer scores)")
        return self

    @model_validator(mode="after")
    def _trainable_endpoints(self) -> T1Config:
        if not self.coordinator.train:
            return self
        for i, ep in enumerate(self.inference.pool.openai):
            where = f"inference.pool.openai[{i}]"
            if ep.api != "completions":
                raise ValueError(f"{where}.api: {ep.api!r} is text-level (no exact token ids); training needs "
                                 "'completions' on a server that returns token ids, or coordinator.train: false")
            if ep.weight_updates == "none":
                raise ValueError(f"{where}.weight_updates: 'none' cannot load new weights; training needs "
                                 "'vllm_dev' (a vLLM server with VLLM_SERVER_DEV_MODE=1), or coordinator.train: false")
        return self

    @model_validator(mode="after")
    def _warm_start_sets_known(self) -> T1Config:
        ws = self.trainer.warm_start
        named = [("sft_validation_set", ws.sft_validation_set)] if ws.sft_validation_set is not None else []
        named += [("demo_sets", name) for name in ws.demo_sets or []]
        known = ", ".join(sorted(self.tasks.sets)) or "none"
        for field, name in named:
            if name not in self.tasks.sets:
                raise ValueError(f"trainer.warm_start.{field}: {name!r} is not in tasks.sets (known: {known})")
        return self
