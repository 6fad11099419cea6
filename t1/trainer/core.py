"""The trainer's synchronous core: stages, one step at a time, and the commit that makes it durable.

Stages run in order: SFT on demonstrations (sft_steps), critic warm-up on rollouts
(critic_warmup_steps, the policy untouched), PPO (max_steps), then DONE. Every step ends with:

  checkpoint (every checkpoint_every steps, and at a stage change)
    -> one database transaction: the steps since the last checkpoint, their trajectories marked
       consumed, the checkpoint tag and the counters
    -> publish weights/v{N} for each policy update -> announce.

On start the core loads the checkpoint the database names, drops weight versions newer than it,
and republishes its version if that folder is missing; pending trajectories are trained again
only if the step that took them was never committed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import torch

from t1.config.schema import T1Config
from t1.routing.adapters import find_routers
from t1.trainer import engine as ds
from t1.trainer import sequence_parallel
from t1.trainer.admission import ModelBounds
from t1.trainer.batch import BatchStats, TrainSequence, build_sequences
from t1.trainer.buffer import StepRecord, TrajectoryBuffer
from t1.trainer.checkpoint import Checkpointer
from t1.trainer.demos import load_demos, ptx_demos
from t1.trainer.learner import Learner
from t1.trainer.models import load_critic, load_policy
from t1.trainer.publish import PublishedVersion, Publisher
from t1.trainer.sft import REFERENCE_DIR, anchor_reference, published_weights, sft_batch, sft_lr_at
from t1.trainer.validation import RoutingSpec
from t1.trajectory.serialization import decode_trajectory

log = logging.getLogger(__name__)


class Stage(StrEnum):
    SFT = "sft"
    CRITIC_WARMUP = "critic_warmup"
    PPO = "ppo"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class TrainState:
    """Counters that a checkpoint restores (kept in the buffer database's meta table)."""

    step: int = 0
    policy_version: int = 0
    sft_steps: int = 0
    sft_ended: bool = False  # the client ended SFT before sft_steps (warm_start.sft_eval_every)
    sft_kept_step: int = 0   # the SFT step whose weights the client kept as the warm start (0: the last)
    warmup_steps: int = 0
    ppo_steps: int = 0
    dropped_stale_tokens: int = 0
    checkpoint_tag: str | None = None
    checkpoint_tags: tuple[str, ...] = ()
    last_metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    stage: Stage
    state: TrainState
    published: PublishedVersion | None


def policy_path(cfg: T1Config) -> Path:
    return cfg.trainer.policy_path or cfg.inference.model.path


class TrainerCore:
    """Builds the engines from config and runs steps; call from one thread at a time."""

    def __init__(self, cfg: T1Config) -> None:
        tc = self.tc = cfg.trainer
        self.cfg = cfg
        self.group_size = cfg.rollout.group_size
        self.process_rewards = cfg.reward.process_every_k_turns is not None
        self.work_dir = tc.work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(tc.seed)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        ds.init_distributed()
        self.device = ds.device()
        src = policy_path(cfg)
        self.buffer = TrajectoryBuffer(self.work_dir / "buffer.sqlite") if ds.rank() == 0 else None
        policy = load_policy(src).to(self.device)
        critic = load_critic(tc.critic_path or src).to(self.device) if tc.rl.critic else None
        sp_size = tc.sequence_parallel_size
        self.sp, mpu = sequence_parallel.enable([policy] if critic is None else [policy, critic], sp_size,
                                                ds.world_size())
        self.policy = ds.build_engine(policy, tc.deepspeed, None, tc.activation_checkpointing, mpu, sp_size)
        self.critic = None if critic is None else ds.build_engine(
            critic, tc.deepspeed, tc.warm_start.critic_lr, tc.activation_checkpointing, mpu, sp_size)
        reference = None
        if tc.rl.kl_coef > 0:  # the warm start once SFT has ended (anchor_reference), else the starting model
            anchored = self.work_dir / REFERENCE_DIR
            reference = load_policy(anchored if (anchored / "config.json").is_file() else src)
            reference = reference.to(self.device).eval().requires_grad_(False)
        self.learner = Learner(
            self.policy,
            self.critic,
            tc.rl,
            self.device,
            reference,
            temperature=cfg.rollout.sampling.temperature,
            checkpoint_tokens=1 if tc.activation_checkpointing else tc.activation_checkpointing_tokens,
            sp=self.sp,
        )
        routers = find_routers(self.policy.module)
        self.routing_spec = RoutingSpec(len(routers), routers[0].top_k, routers[0].num_experts)
        embeddings = cast(Any, policy).get_input_embeddings()  # a Hugging Face model's embedding table
        self.model_bounds = ModelBounds(int(embeddings.num_embeddings), self.routing_spec, cfg.limits.max_abs_reward)
        self.publisher = Publisher(self.work_dir / "weights", src, tc.keep_versions)
        self.checkpointer = Checkpointer(self.work_dir / "checkpoints", keep_manual=tc.keep_manual_checkpoints)
        self.demos: list[TrainSequence] = []
        self.ptx_demos: list[TrainSequence] = []   # PPO-ptx's: the demonstrations less rl.ptx_skip_tasks
        if tc.trains_on_demos and tc.warm_start.demos_path is not None:
            demos = load_demos(tc.warm_start.demos_path)
            self.demos = [d.seq for d in demos]
            self.ptx_demos = ptx_demos(demos, tc.rl.ptx_skip_tasks) if tc.rl.demo_nll_coef > 0 else []
            if self.ptx_demos and tc.rl.ptx_skip_tasks is not None:
                log.info("PPO-ptx trains on %d of the %d demonstration segments (rl.ptx_skip_tasks %r)",
                         len(self.ptx_demos), len(self.demos), tc.rl.ptx_skip_tasks)
        self.state = self._restore()
        self._uncommitted: list[StepRecord] = []
        # Steered SFT waits at this many steps until the client allows more (or ends SFT); else no gate.
        self.sft_allowed = self.state.sft_steps if tc.warm_start.sft_eval_every else tc.warm_start.sft_steps
        self._threads = torch.get_num_threads()

    # -- state ---------------------------------------------------------------------------------

    def _restore(self) -> TrainState:
        meta = ds.broadcast_object(self.buffer.meta() if self.buffer is not None else {})
        fields: dict[str, Any] = {k: (tuple(v) if k == "checkpoint_tags" else v) for k, v in meta.items()
                                  if k in TrainState.__dataclass_fields__}
        state = TrainState(**fields)
        if state.checkpoint_tag is not None:
            self.checkpointer.load(state.checkpoint_tag, self.policy, self.critic)
            log.info("resumed from checkpoint %s: step %d, policy version %d", state.checkpoint_tag, state.step,
                     state.policy_version)
        if ds.rank() == 0:
            self.publisher.drop_after(state.policy_version)
            have = {v.version for v in self.publisher.published()}
            if state.policy_version > 0 and state.policy_version not in have:
                self._publish(state.policy_version, state.step)
        return state

    def stage(self) -> Stage:
        s, ws = self.state, self.tc.warm_start
        if not s.sft_ended and s.sft_steps < ws.sft_steps and self.demos:
            return Stage.SFT
        if s.warmup_steps < ws.critic_warmup_steps:
            return Stage.CRITIC_WARMUP
        if s.ppo_steps < self.tc.max_steps:
            return Stage.PPO
        return Stage.DONE

    def sft_waiting(self) -> bool:
        """Steered SFT at its allowance: no step until the client allows more or ends SFT."""
        return self.stage() == Stage.SFT and self.state.sft_steps >= self.sft_allowed

    def allow_sft(self, steps: int) -> None:
        self.sft_allowed = max(self.sft_allowed, steps)

    def end_sft(self, keep_step: int = 0) -> PublishedVersion | None:
        """End SFT at the steps taken (durable: committed with a checkpoint); the warm-up comes next.

        `keep_step` (a steered round's last step, before the steps taken): the policy goes back to the weights
        published after that many SFT steps (a later round over-fitted the demonstrations) and is published as
        a new version, which is returned; the inference servers serve it before the warm start is evaluated."""
        if self.stage() != Stage.SFT:
            return None
        s = self.state
        restore = 0 < keep_step < s.sft_steps
        if keep_step > s.sft_steps:
            raise ValueError(f"keep_step {keep_step} is beyond the {s.sft_steps} SFT steps taken")
        if restore:
            ds.load_module_weights(self.policy, published_weights(self.publisher, keep_step, self.tc))
            s = replace(s, policy_version=s.policy_version + 1)
        self.state = replace(s, sft_ended=True, sft_kept_step=keep_step or s.sft_steps)
        log.info("SFT ended by the client after %d steps; the warm start keeps step %d's weights", s.sft_steps,
                 self.state.sft_kept_step)
        self._after_sft()
        self.commit()
        return self._publish(self.state.policy_version, self.state.step) if restore else None

    def _after_sft(self) -> None:
        """At the end of SFT (before the checkpoint that ends it, so a restart resumes the same state):
        - the policy's optimizer forgets SFT's moments: PPO's first steps follow PPO's gradients, at PPO's lr,
          not the momentum and second moments of the imitation loss;
        - the critic's backbone becomes the warm-started policy's (unless trainer.critic_path names a critic of
          its own): its warm-up starts from features that know the tasks, not from the model SFT began with;
        - with rl.kl_coef, the KL reference becomes the warm-started policy (`anchor_reference`)."""
        ds.reset_optimizer_state(self.policy)
        anchor_reference(self.learner.reference, self.policy, self.work_dir, self.state.policy_version)
        if self.critic is None or self.tc.critic_path is not None:
            return
        if ds.copy_backbone(self.policy, self.critic):
            log.info("critic backbone set from the warm-started policy (version %d)", self.state.policy_version)
        else:
            log.warning("ZeRO-3: the critic keeps the backbone it was loaded with (not the warm-started policy's)")

    def reported_status(self) -> tuple[TrainState, Stage]:
        """What GetStatus reports: DONE only once the last step is committed (durable in the buffer)."""
        state, stage = self.state, self.stage()
        if stage == Stage.DONE and self._uncommitted:
            stage = Stage.PPO
        return state, stage

    # -- steps ---------------------------------------------------------------------------------

    def take_groups(self) -> list[tuple[str, list[tuple[str, bytes]]]] | None:
        """Rank 0: the next step's complete groups, or None when not enough are buffered."""
        assert self.buffer is not None
        taken = {g for record in self._uncommitted for g in record.group_ids}
        groups = self.buffer.complete_groups(self.group_size, self.tc.rl.groups_per_step, taken)
        return groups if len(groups) >= self.tc.rl.groups_per_step else None

    def step(self, groups: list[tuple[str, list[tuple[str, bytes]]]] | None) -> StepOutcome:
        """One step of the current stage (groups: the rollouts for warm-up and PPO steps)."""
        stage = self.stage()
        if stage == Stage.DONE:
            raise RuntimeError("training is done")
        s = self.state
        ids: tuple[str, ...] = ()
        group_ids: tuple[str, ...] = ()
        _use_threads(self.tc.warm_start.sft_threads if stage == Stage.SFT else 0, self._threads)
        if stage == Stage.SFT:
            sft_lr = sft_lr_at(self.tc.warm_start, s.sft_steps)
            with ds.learning_rate(self.policy, sft_lr):
                metrics = self.learner.sft_step(sft_batch(self.demos, self.tc.warm_start.sft_batch, s.sft_steps,
                                                          self.tc.seed))
            if sft_lr is not None:
                metrics["sft_lr"] = sft_lr
            new = replace(s, sft_steps=s.sft_steps + 1)
        else:
            assert groups is not None
            ids = tuple(tid for _, members in groups for tid, _ in members)
            group_ids = tuple(g for g, _ in groups)
            trajs = [[decode_trajectory(p) for _, p in members] for _, members in groups]
            seqs, stats = build_sequences(trajs, s.policy_version, self.tc.rl.max_policy_lag,
                                          self.cfg.reward.infra_error_policy, self.process_rewards)
            lr = self._ppo_lr(s.ppo_steps) if stage == Stage.PPO else None
            with ds.learning_rate(self.policy, lr):
                metrics = self._rl_metrics(seqs, stats, update_policy=stage == Stage.PPO)
            if lr is not None:
                metrics["policy_lr"] = lr
            new = replace(s, dropped_stale_tokens=s.dropped_stale_tokens + stats.dropped_stale_tokens)
            new = replace(new, warmup_steps=new.warmup_steps + 1) if stage == Stage.CRITIC_WARMUP else \
                replace(new, ppo_steps=new.ppo_steps + 1)
        updated_policy = stage in (Stage.SFT, Stage.PPO)
        new = replace(new, step=s.step + 1, policy_version=s.policy_version + int(updated_policy),
                      last_metrics=metrics)
        self.state = new
        if stage == Stage.SFT and self.stage() != Stage.SFT:
            self._after_sft()
        self._uncommitted.append(StepRecord(new.step, str(stage), new.policy_version, ids, metrics, group_ids))
        log.info("step %d (%s) version %d: %s", new.step, stage, new.policy_version,
                 ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
        if new.step % self.tc.checkpoint_every == 0 or self.stage() != stage:
            self.commit()
        # SFT publishes where someone waits for its weights: a steered round's last step and SFT's end (every
        # step's folder would be loaded by the inference servers, competing with SFT for the cores).
        sft_midway = stage == Stage.SFT and self.stage() == Stage.SFT and new.sft_steps < self.sft_allowed
        published = self._publish(new.policy_version, new.step) if updated_policy and not sft_midway else None
        return StepOutcome(stage, self.state, published)

    def _ppo_lr(self, ppo_steps: int) -> float:
        """The policy's lr at PPO step `ppo_steps` (0-based): the optimizer's own, scaled by (k + 1) / (n + 1)
        during the n steps of rl.lr_warmup_steps."""
        n = self.tc.rl.lr_warmup_steps
        return float(self.policy.optimizer.param_groups[0]["lr"]) * min(1.0, (ppo_steps + 1) / (n + 1))

    def _rl_metrics(self, seqs: list[TrainSequence], stats: BatchStats, update_policy: bool) -> dict[str, float]:
        metrics: dict[str, float] = {
            "reward_mean": stats.reward_mean, "solve_rate": stats.solve_rate, "policy_lag": stats.policy_lag_mean,
            "policy_lag_max": float(stats.policy_lag_max), "dropped_stale_tokens": float(stats.dropped_stale_tokens),
            "dropped_infra_trajectories": float(stats.dropped_infra_trajectories),
            "dropped_groups": float(stats.dropped_groups), "trajectories": float(stats.num_trajectories),
        }
        if stats.num_action_tokens == 0:
            return metrics
        prep = self.learner.prepare(seqs)
        metrics.update(prep.metrics)
        metrics.update(self.learner.ppo_step(seqs, prep, update_policy, self._ptx_batches() if update_policy else ()))
        return metrics

    def _ptx_batches(self) -> list[list[TrainSequence]]:
        """PPO-ptx: this PPO step's demonstration batch per epoch (rl.demo_nll_coef), in shuffled epochs of the
        demonstrations of their own (seeded apart from SFT's)."""
        if self.tc.rl.demo_nll_coef <= 0 or not self.ptx_demos:
            return []
        n, ws = self.tc.rl.ppo_epochs, self.tc.warm_start
        return [sft_batch(self.ptx_demos, ws.sft_batch, self.state.ppo_steps * n + e, self.tc.seed + 1)
                for e in range(n)]

    def commit(self) -> None:
        """Checkpoint, then record the uncommitted steps and the checkpoint in one transaction."""
        tag = f"step{self.state.step}"
        self.checkpointer.save(tag, self.policy, self.critic)
        tags = (*self.state.checkpoint_tags, tag)[-2:]
        self.state = replace(self.state, checkpoint_tag=tag, checkpoint_tags=tags)
        if self.buffer is not None:
            meta: dict[str, Any] = {k: getattr(self.state, k) for k in TrainState.__dataclass_fields__}
            meta["checkpoint_tags"] = list(tags)
            self.buffer.commit_steps(self._uncommitted, meta)
        self._uncommitted = []
        self.checkpointer.prune(list(tags))

    def commit_pending(self) -> None:
        """Commit steps taken since the last checkpoint (on shutdown)."""
        if self._uncommitted:
            self.commit()

    def _publish(self, version: int, step: int) -> PublishedVersion | None:
        sd = ds.full_state_dict(self.policy)
        if sd is None:
            return None
        return self.publisher.publish(self.policy.module, sd, version, step)

    def save_manual(self, tag: str) -> Path:
        return self.checkpointer.save(tag, self.policy, self.critic)

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()


def _use_threads(wanted: int, default: int) -> None:
    """Set this thread's torch intra-op threads (OpenMP keeps them per calling thread: steps run on a worker)."""
    n = wanted or default
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
