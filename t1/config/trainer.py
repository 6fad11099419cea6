"""Config of the trainer service: RL algorithm, warm start, DeepSpeed, publishing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from t1.config.base import Section
from t1.config.shared import ServerConfig, host_port


def _default_deepspeed() -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0, "torch_adam": True}},
    }


class RlConfig(Section):
    """PPO actor-critic hyper-parameters."""

    gamma: float = Field(1.0, ge=0, le=1, description="Discount per token.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_eps: float = Field(0.2, gt=0, description="PPO ratio clip.")
    clip_eps_high: float | None = Field(None, gt=0, description="Upper clip (asymmetric); null uses clip_eps.")
    value_clip_eps: float = Field(0.2, gt=0, description="Value-loss clip.")
    value_coef: float = Field(0.5, ge=0, description="Critic loss weight.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    kl_coef: float = Field(
        0.0, ge=0, description="KL-to-reference weight; the reference is the warm-started policy once SFT has ended "
        "(work_dir/reference), else the starting model.")
    is_truncation: float = Field(2.0, gt=0, description="Cap of behaviour/proximal importance weights.")
    baseline: Literal["critic", "group_turn"] = Field(
        "critic", description="What an action token's return is compared with: `critic`, GAE with the critic's values "
        "(lam, gamma); `group_turn`, the mean return-to-go at the same turn of the group's other episodes (no critic "
        "in the advantage; the critic still trains and reports explained variance unless rl.critic is false). "
        "t1/trainer/advantages.py.")
    critic: bool = Field(
        True, description="Train a critic (value model) beside the policy. False: no critic is built, so no memory, "
        "forward or backward pass goes to it (a quarter of a PPO step's time in examples/long.yaml); needs baseline "
        "group_turn, whose advantages use no values, and no critic warm-up.")
    advantage_norm: Literal["global", "group", "group_centered", "none"] = Field(
        "global", description="Advantage normalisation: whiten over the batch or within each group; group_centered: "
        "subtract each group's mean, then divide by the batch's std.")
    max_policy_lag: int = Field(4, ge=0, description="Drop tokens sampled more than this many versions ago.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    lr_warmup_steps: int = Field(
        0, ge=0, description="PPO steps over which the policy's lr rises linearly to the optimizer's own (step k of "
        "n at k/(n+1) of it). SFT's end resets the optimizer's moments, and Adam's first steps after a reset move "
        "every weight by about lr, whatever its gradient's size.")
    groups_per_step: int = Field(4, ge=1, description="Complete groups per PPO step.")
    token_budget: int = Field(8192, ge=16, description="Tokens per micro-batch: sequences packed into one row up to "
                                                       "this length.")
    logprob_chunk_tokens: int = Field(
        1024, ge=0, description="Action tokens per chunk of the output projection and log-softmax; 0: full logits.")
    routing_replay: bool = Field(True, description="Replay recorded MoE routing (R3).")
    demo_nll_coef: float = Field(
        0.0, ge=0, description="PPO-ptx: each PPO epoch's policy loss adds this times the mean NLL of a batch of "
        "warm_start.sft_batch demonstrations (warm_start.demos_path), so PPO keeps what SFT taught where a step's "
        "rewards say nothing; 0: off.")
    ptx_skip_tasks: str | None = Field(
        None, description="PPO-ptx leaves out the demonstrations whose task id this regular expression matches "
        "(re.search); SFT still trains on every one. For a teacher's copies that make a choice only the reward should "
        "teach (the curriculum's shortcut copies, task ids ending `-s<j>`: `-s[0-9]+$`), so PPO-ptx does not pull "
        "towards the teacher's share of it. Null: all.")

    @field_validator("ptx_skip_tasks")
    @classmethod
    def _ptx_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"ptx_skip_tasks {value!r} is not a regular expression: {e}") from None
        return value


class WarmStartConfig(Section):
    """SFT on demonstrations, then critic warm-up before PPO."""

    sft_steps: int = Field(0, ge=0, description="SFT steps on oracle demonstrations.")
    critic_warmup_steps: int = Field(0, ge=0, description="Critic-only steps before any policy update.")
    critic_lr: float = Field(1e-4, gt=0, description="Critic learning rate (warm-up and PPO).")
    sft_eval_every: int | None = Field(
        None, ge=1, description="Steered SFT: the coordinator evaluates sft_validation_set every this many SFT steps "
        "and ends SFT when its solve rate stops rising (sft_patience evals without a new best); sft_steps is then "
        "the cap. Null: SFT runs sft_steps.")
    sft_patience: int = Field(2, ge=1, description="Validation evals without a new best solve rate that end SFT.")
    sft_min_gain: float = Field(
        0.0, ge=0, lt=1, description="A validation solve rate is a new best only if it beats the best so far by at "
        "least this (a rise within the eval's noise is not a rise; 0.05 is 2 of 40 attempts).")
    sft_pool_rounds: int = Field(
        1, ge=1, description="The plateau rule and the kept round judge each validation eval pooled with the evals "
        "before it, this many in all (2 halves one eval's variance; adjacent rounds' weights differ little).")
    sft_validation_set: str | None = Field(
        None, description="The task set (tasks.sets) of steered SFT's validation evals: training tasks held out.")
    sft_eval_attempts: int = Field(1, ge=1, description="Attempts per task of each validation eval.")
    sft_batch: int | None = Field(
        None, ge=1, description="Demonstration sequences per SFT step (shuffled epochs); null: all of them every step.")
    sft_lr: float | None = Field(
        None, gt=0, description="Policy learning rate of SFT steps; null uses the DeepSpeed optimizer's (PPO's) lr.")
    sft_lr_final: float | None = Field(
        None, gt=0, description="With sft_lr: SFT's lr follows a cosine from sft_lr down to this at sft_steps (the "
        "cap), so the rounds near the plateau take small steps; null keeps sft_lr.")
    sft_threads: int = Field(
        0, ge=0, description="torch intra-op threads of SFT steps (no rollouts compete for the cores then); 0 keeps "
        "the trainer's (OMP_NUM_THREADS). Warm-up and PPO steps use the trainer's.")
    demos_path: Path | None = Field(
        None, description="Demonstrations for SFT: a spool file of msgpack trajectory records, or a folder of them.")
    demo_sets: list[str] | None = Field(
        None, description="Task sets (tasks.sets) whose oracle runs become the demonstrations when demos_path is "
                          "missing; null: tasks.train. Sets of their own keep PPO on tasks SFT never saw.")

    @model_validator(mode="after")
    def _demos_for_sft(self) -> WarmStartConfig:
        if self.sft_steps > 0 and self.demos_path is None:
            raise ValueError("sft_steps > 0 needs demos_path")
        if self.sft_lr_final is not None and (self.sft_lr is None or self.sft_lr_final > self.sft_lr):
            raise ValueError("sft_lr_final needs sft_lr, and at most it (the lr decays to it)")
        if self.sft_eval_every is not None and self.sft_validation_set is None:
            raise ValueError("sft_eval_every needs sft_validation_set (a task set of held-out training tasks)")
        return self


class TrainerConfig(Section):
    """The t1-trainer process."""

    server: ServerConfig = Field(default_factory=ServerConfig, description="Where the trainer listens.")
    endpoint: str | None = Field(None, description="host:port of a remote trainer; null means start one locally.")
    work_dir: Path = Field(Path(".t1/trainer"), description="Buffer, checkpoints and published weights.")
    policy_path: Path | None = Field(None, description="Policy model folder; null uses inference.model.path.")
    critic_path: Path | None = Field(None, description="Critic model folder; null initialises from the policy.")
    activation_checkpointing: bool = Field(False, description="Recompute every decoder layer in backward, whatever the "
                                                              "row length.")
    activation_checkpointing_tokens: int = Field(
        4096, ge=1, description="Rows of at least this many tokens recompute each decoder layer in backward.")
    sequence_parallel_size: int = Field(
        1, ge=1, description="Ranks that share each packed row (DeepSpeed Ulysses); divides the world size "
        "and the model's attention heads. 1: no sequence parallelism.")
    keep_versions: int = Field(
        3, ge=1, description="Published weight folders kept; with steered SFT more than warm_start.sft_patience "
        "(the warm start's round is restored from its folder when SFT ends).")
    checkpoint_every: int = Field(1, ge=1, description="Checkpoint every N steps.")
    lock_wait_s: float = Field(
        120.0, ge=0, description="How long a new trainer waits for a previous one on work_dir to finish stopping.")
    keep_manual_checkpoints: int = Field(
        3, ge=1, description="Manual (SaveCheckpoint) tags kept, newest first; older ones are removed.")
    max_steps: int = Field(10, ge=0, description="PPO steps before the run stops.")
    seed: int = Field(0, description="Trainer seed.")
    rl: RlConfig = Field(default_factory=RlConfig, description="Algorithm.")
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig, description="Warm start stages.")
    deepspeed: dict[str, Any] = Field(
        default_factory=_default_deepspeed, description="DeepSpeed JSON config, as DeepSpeed documents it."
    )

    @property
    def trains_on_demos(self) -> bool:
        """SFT or PPO-ptx trains on the demonstrations (warm_start.demos_path)."""
        return self.warm_start.sft_steps > 0 or self.rl.demo_nll_coef > 0

    @field_validator("endpoint")
    @classmethod
    def _trainer_address(cls, value: str | None) -> str | None:
        return host_port(value) if value else value

    @model_validator(mode="after")
    def _best_round_kept(self) -> TrainerConfig:
        ws = self.warm_start
        if not self.rl.critic and self.rl.baseline != "group_turn":
            raise ValueError(f"rl.critic false needs rl.baseline group_turn: baseline {self.rl.baseline!r} takes its "
                             "advantages from the critic's values")
        if not self.rl.critic and (ws.critic_warmup_steps or self.critic_path is not None):
            raise ValueError("rl.critic false: warm_start.critic_warmup_steps must be 0 and critic_path unset "
                             "(there is no critic to warm up or load)")
        if self.rl.demo_nll_coef > 0 and ws.demos_path is None:
            raise ValueError("rl.demo_nll_coef > 0 needs warm_start.demos_path (the demonstrations PPO-ptx keeps)")
        if ws.sft_eval_every is not None and self.keep_versions <= ws.sft_patience:
            raise ValueError(f"keep_versions ({self.keep_versions}) must exceed warm_start.sft_patience "
                             f"({ws.sft_patience}): the warm start's round is restored from its published folder")
        return self
