"""What one episode may do: its limits, made from the rollout and reward config."""

from __future__ import annotations

from dataclasses import dataclass

from t1.config.rollout import RolloutConfig
from t1.config.tasks import RewardConfig


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    """An episode's limits, made from the rollout and reward config sections (the defaults live there)."""

    max_turns: int
    max_bad_replies: int | None
    max_context_tokens: int
    timeout_multiplier: float
    compaction: bool
    compaction_trigger: float
    keep_last_turns: int
    max_segments: int
    compaction_by_policy: bool
    summary_max_tokens: int
    process_every_k: int | None
    turn_retries: int
    setup_retries: int
    steps_per_loop_tick: int  # t1.agent.pacing; 0: no pacing
    bad_reply_penalty: float = 0.0  # taken off the reward for each reply with no valid action

    @classmethod
    def from_config(cls, rollout: RolloutConfig, reward: RewardConfig, timeout_multiplier: float | None = None
                    ) -> EpisodeLimits:
        """`timeout_multiplier` replaces rollout.timeout_multiplier (an eval job's own)."""
        c = rollout.compaction
        return cls(max_turns=rollout.max_turns, max_bad_replies=rollout.max_bad_replies,
                   max_context_tokens=rollout.max_context_tokens,
                   timeout_multiplier=timeout_multiplier or rollout.timeout_multiplier, compaction=c.enabled,
                   compaction_trigger=c.trigger_fraction, keep_last_turns=c.keep_last_turns,
                   max_segments=c.max_segments, compaction_by_policy=c.mode == "policy",
                   summary_max_tokens=c.summary_max_tokens, process_every_k=reward.process_every_k_turns,
                   turn_retries=rollout.turn_retries, setup_retries=rollout.setup_retries,
                   steps_per_loop_tick=rollout.steps_per_loop_tick, bad_reply_penalty=reward.bad_reply_penalty)
