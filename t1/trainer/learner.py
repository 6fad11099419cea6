"""One optimisation step on DeepSpeed engines: PPO actor-critic, critic-only warm-up, and SFT.

A step is: (1) a no-grad pass with the pre-update policy (routing replayed) and critic giving the
proximal logprobs and old values; (2) rewards -> GAE -> normalised advantages; (3) per PPO epoch,
every token-budget micro-batch (a packed row, t1.trainer.packing) is forwarded and backpropagated
through losses.ppo_objective (averaged over the step's action tokens), then one engine.step() per
engine. Logprobs and entropy come from t1.trainer.token_stats (no T x V tensor); metrics stay on
the device until the step ends and are read once. Under sequence parallelism
(t1.trainer.sequence_parallel) every rank of an SP group takes the same micro-batches and forwards
its slice of each row; pre-update results are gathered over the group, metric sums added up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from t1.config.trainer import RlConfig
from t1.routing.replay import REPLAY_COVERAGE, ROUTER_DISAGREEMENT, ReplayStats
from t1.trainer import losses
from t1.trainer.advantages import episode_gae, group_turn_advantages, normalize_advantages
from t1.trainer.batch import TrainSequence
from t1.trainer.engine import rank, world_size
from t1.trainer.models import checkpoint_layers, critic_values, maybe_replay
from t1.trainer.packing import (
    PackedBatch,
    actions_of,
    micro_batches,
    pack,
    per_position,
    scatter_actions,
)
from t1.trainer.sequence_parallel import (
    SOLO,
    Shard,
    SpGroup,
    gather_actions,
    gather_row,
    shard,
    sum_over_group,
)
from t1.trainer.token_stats import TokenStats, policy_token_stats


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """Pre-update quantities per sequence (position-aligned arrays of length N)."""

    prox_logp: list[np.ndarray]
    values: list[np.ndarray]
    advantages: list[np.ndarray]
    returns: list[np.ndarray]
    metrics: dict[str, float]


class _StepSums:
    """The objective's metric sums over a step's micro-batches, kept on the device until `means`."""

    def __init__(self, sp: SpGroup = SOLO) -> None:
        self.sums_M: torch.Tensor | None = None
        self.counts_M = torch.zeros(len(losses.METRICS))
        self.sp = sp

    def add(self, out: losses.ObjectiveOut) -> None:
        self.sums_M = out.sums_M if self.sums_M is None else self.sums_M + out.sums_M
        self.counts_M += out.counts_M

    def means(self) -> dict[str, float]:
        if self.sums_M is None:
            return {}
        both = sum_over_group(torch.cat([self.sums_M, self.counts_M.to(self.sums_M.device)]), self.sp)
        sums_counts = both.cpu().tolist()  # the step's one device-to-host read of the loss metrics
        sums, counts = sums_counts[:len(losses.METRICS)], sums_counts[len(losses.METRICS):]
        return {name: total / count for name, total, count in zip(losses.METRICS, sums, counts, strict=True)
                if count > 0 and np.isfinite(total)}


def coefficients(rl: RlConfig) -> losses.Coefficients:
    return losses.Coefficients(clip_eps=rl.clip_eps, clip_eps_high=rl.clip_eps_high, is_cap=rl.is_truncation,
                               entropy_coef=rl.entropy_coef, kl_coef=rl.kl_coef, value_clip_eps=rl.value_clip_eps,
                               value_coef=rl.value_coef)


def replay_metrics(stats: Sequence[ReplayStats], sp: SpGroup = SOLO) -> dict[str, float]:
    """Coverage and router disagreement over the given replay blocks (the step's pre-update pass),
    summed over the SP group's slices."""
    if not stats:
        return {}
    counts = torch.tensor([[s.replayed_rows, s.fallback_rows, s.compared_slots, s.disagreeing_slots] for s in stats],
                          dtype=torch.float64).sum(dim=0)
    replayed, fallback, compared, disagreeing = sum_over_group(counts, sp).tolist()
    rows = replayed + fallback
    return {"t1_routing_replay_coverage": 1.0 if rows == 0 else replayed / rows,
            "t1_router_disagreement_rate": 0.0 if compared == 0 else disagreeing / compared}


class Learner:
    """Owns the policy and critic engines (and an optional frozen reference) and steps them."""

    def __init__(self, policy: Any, critic: Any | None, rl: RlConfig, device: torch.device,
                 reference: torch.nn.Module | None = None, temperature: float = 1.0,
                 checkpoint_tokens: int | None = None, sp: SpGroup = SOLO) -> None:
        self.policy, self.critic, self.rl, self.device, self.reference = policy, critic, rl, device, reference
        self.sp = sp
        # Behaviour logprobs are of the sampling distribution: logits / temperature (0 = greedy: none).
        self.temperature = temperature if temperature > 0 else 1.0
        # Rows of at least this many tokens recompute each decoder layer in backward (None: never).
        self.checkpoint_tokens = checkpoint_tokens

    def _checkpointing(self, model: Any, sh: Shard) -> None:
        if self.checkpoint_tokens is not None:  # by this rank's positions: its memory
            checkpoint_layers(model, int(sh.batch.input_ids.shape[1]) >= self.checkpoint_tokens)

    def _replay(self, model: Any, sh: Shard) -> Any:
        return maybe_replay(model, sh.batch, self.rl.routing_replay, sh.padding)

    def _stats(self, model: Any, batch: PackedBatch, temperature: float | None = None) -> TokenStats:
        return policy_token_stats(model, batch, self.device, chunk_tokens=self.rl.logprob_chunk_tokens,
                                  temperature=self.temperature if temperature is None else temperature)

    def _batches(self, seqs: Sequence[TrainSequence]) -> list[tuple[list[int], PackedBatch]]:
        groups = micro_batches([s.num_tokens for s in seqs], self.rl.token_budget)
        return [(idx, pack([seqs[i] for i in idx])) for idx in groups]

    def _rank_batches(self, seqs: Sequence[TrainSequence]) -> list[tuple[list[int], PackedBatch, float]]:
        """This rank's share of the micro-batches, with a loss scale.

        Ranks take micro-batches round robin; every rank runs the same number of backward passes
        (ZeRO reduces in them), a rank short of work repeats one at scale 0. The scale of real work
        is the data-parallel size: DeepSpeed averages gradients over data-parallel groups (and sums
        them over the ranks of an SP group, which take the same micro-batches).
        """
        all_batches = self._batches(seqs)
        ws, r = world_size() // self.sp.size, rank() // self.sp.size  # data-parallel groups
        if ws == 1:
            return [(idx, b, 1.0) for idx, b in all_batches]
        mine = [(idx, b, float(ws)) for idx, b in all_batches[r::ws]]
        slots = -(-len(all_batches) // ws)
        while len(mine) < slots:
            mine.append((all_batches[0][0], all_batches[0][1], 0.0))
        return mine

    @torch.no_grad()
    def prepare(self, seqs: Sequence[TrainSequence]) -> Prepared:
        n = len(seqs)
        prox: list[np.ndarray] = [np.zeros(s.num_tokens, np.float32) for s in seqs]
        values: list[np.ndarray] = [np.zeros(s.num_tokens, np.float32) for s in seqs]
        replays: list[ReplayStats] = []
        outputs: list[tuple[list[int], PackedBatch, torch.Tensor, torch.Tensor | None]] = []
        for idx, batch in self._batches(seqs):
            sh = shard(batch, self.sp)
            with self._replay(self.policy, sh) as stats:
                logp_N = gather_actions(self._stats(self.policy, sh.batch).logp_N, sh, self.sp)
            if stats is not None:
                replays.append(stats)
            v = None
            if self.critic is not None:
                v = gather_row(critic_values(self.critic, sh.batch, self.device), sh, self.sp)
            outputs.append((idx, batch, logp_N, v))
        for idx, batch, logp_N, v in outputs:  # host reads after every forward is queued
            for i, arr in zip(idx, scatter_actions(logp_N.cpu().numpy(), batch), strict=True):
                prox[i] = arr
            if v is not None:
                for i, arr in zip(idx, per_position(v, batch.lengths), strict=True):
                    values[i] = arr
        metrics = replay_metrics(replays, self.sp)
        masks = [s.loss_mask for s in seqs]
        diffs = np.concatenate([np.abs(p[m] - s.behav_logp[m]) for p, m, s in zip(prox, masks, seqs, strict=True)]
                               ) if n else np.zeros(0, np.float32)
        metrics["t1_train_infer_logprob_abs_diff"] = float(diffs.mean()) if diffs.size else 0.0
        metrics["t1_train_infer_logprob_abs_diff_max"] = float(diffs.max()) if diffs.size else 0.0
        advs, rets = self._advantages(seqs, values)
        r_all = np.concatenate([r[m] for r, m in zip(rets, masks, strict=True)])
        if self.critic is not None:  # no critic (rl.critic false): no values to report
            v_all = np.concatenate([v[m] for v, m in zip(values, masks, strict=True)])
            metrics["explained_variance"] = losses.explained_variance(
                torch.from_numpy(v_all), torch.from_numpy(r_all), torch.ones(v_all.shape[0], dtype=torch.bool))
            metrics["value_mean"] = float(v_all.mean()) if v_all.size else 0.0
        metrics["return_mean"] = float(r_all.mean()) if r_all.size else 0.0
        return Prepared(prox, values, advs, rets, metrics)

    def _advantages(
        self, seqs: Sequence[TrainSequence], values: list[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        by_episode: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(seqs):
            by_episode[s.trajectory_id].append(i)
        advs: list[np.ndarray] = [np.zeros(0, np.float32)] * len(seqs)
        rets: list[np.ndarray] = [np.zeros(0, np.float32)] * len(seqs)
        for members in by_episode.values():
            members.sort(key=lambda i: seqs[i].segment)
            a, r = episode_gae([seqs[i].loss_mask for i in members], [seqs[i].rewards for i in members],
                               [values[i] for i in members], self.rl.gamma, self.rl.lam)
            for j, i in enumerate(members):
                advs[i], rets[i] = a[j], r[j]
        if self.rl.baseline == "group_turn":
            turns = [s.turn_ids for s in seqs]
            if any(t is None for t in turns):
                raise ValueError("rl.baseline group_turn needs every sequence's turn ids (t1/trainer/batch.py)")
            advs = group_turn_advantages([s.loss_mask for s in seqs], [s.rewards for s in seqs],
                                         cast(list[np.ndarray], turns), [s.trajectory_id for s in seqs],
                                         [s.segment for s in seqs], [s.group_id for s in seqs], self.rl.gamma)
        normed = normalize_advantages(advs, [s.loss_mask for s in seqs], [s.group_id for s in seqs],
                                      self.rl.advantage_norm)
        return normed, rets

    def ppo_step(self, seqs: Sequence[TrainSequence], prep: Prepared, update_policy: bool,
                 demos: Sequence[Sequence[TrainSequence]] = ()) -> dict[str, float]:
        """PPO epochs over the batch; the policy is updated only when update_policy (else critic only).

        `demos` (PPO-ptx, rl.demo_nll_coef): one batch of demonstrations per epoch, whose mean NLL times the
        coefficient joins that epoch's policy gradient, so PPO keeps what SFT taught where the step's rewards
        say nothing (a family every attempt of a group solves gives no advantage to hold its behaviour)."""
        denom = float(sum(int(s.loss_mask[1:].sum()) for s in seqs))
        ptx: list[float] = []
        sums = _StepSums(self.sp)
        grad_norms: list[float] = []
        coefs = coefficients(self.rl)
        batches = self._rank_batches(seqs)
        for epoch in range(self.rl.ppo_epochs):
            if update_policy and demos and self.rl.demo_nll_coef > 0:
                nll = self._nll_backward(demos[epoch % len(demos)], self.rl.demo_nll_coef)
                if nll is not None:
                    ptx.append(nll)
            for idx, batch, scale in batches:
                step_denom = denom / scale if scale else 1.0
                sh = shard(batch, self.sp)
                # One side at a time, so only one engine's graph is alive.
                if update_policy:
                    self._checkpointing(self.policy, sh)
                    # backward inside the replay block: checkpointed layers recompute with the recorded experts
                    with self._replay(self.policy, sh):
                        out = losses.ppo_objective(self._policy_inputs(seqs, prep, idx, batch, sh), None, coefs=coefs,
                                                   denom=step_denom)
                        assert out.policy_loss is not None
                        self.policy.backward(out.policy_loss * (1.0 if scale else 0.0), scale_wrt_gas=False)
                    if scale:
                        sums.add(out)
                if self.critic is not None:
                    out = losses.ppo_objective(None, self._value_inputs(prep, idx, batch, sh), coefs=coefs,
                                               denom=step_denom)
                    assert out.value_loss is not None
                    self.critic.backward(out.value_loss * (1.0 if scale else 0.0), scale_wrt_gas=False)
                    if scale:
                        sums.add(out)
            if update_policy:
                self.policy.step()
                grad_norms.append(_grad_norm(self.policy))
            if self.critic is not None:
                self.critic.step()
        out_metrics = sums.means()
        if grad_norms:
            out_metrics["grad_norm"] = float(np.mean(grad_norms))
        if ptx:
            out_metrics["ptx_nll"] = ptx[0]  # the demonstrations' NLL before this step's update
        out_metrics["action_tokens"] = denom
        # The trainer's gauges say what the step's metrics say: the pre-update pass over the whole step.
        if "t1_routing_replay_coverage" in prep.metrics:
            REPLAY_COVERAGE.set(prep.metrics["t1_routing_replay_coverage"])
            ROUTER_DISAGREEMENT.set(prep.metrics["t1_router_disagreement_rate"])
        return out_metrics

    def _policy_inputs(self, seqs: Sequence[TrainSequence], prep: Prepared, idx: list[int],
                       batch: PackedBatch, sh: Shard) -> losses.PolicyInputs:
        """The policy side of this rank's slice of a micro-batch; call inside the slice's replay block."""
        dev = self.device
        stats = self._stats(self.policy, sh.batch)
        ref_logp_N = None
        if self.reference is not None and self.rl.kl_coef > 0:
            with torch.no_grad(), self._replay(self.reference, sh):
                ref_logp_N = self._stats(self.reference, sh.batch).logp_N
        return losses.PolicyInputs(
            logp_N=stats.logp_N, entropy_N=stats.entropy_N, ref_logp_N=ref_logp_N,
            prox_logp_N=actions_of([prep.prox_logp[i] for i in idx], batch)[sh.actions].to(dev),
            behav_logp_N=actions_of([seqs[i].behav_logp for i in idx], batch)[sh.actions].to(dev),
            advantages_N=actions_of([prep.advantages[i] for i in idx], batch)[sh.actions].to(dev))

    def _value_inputs(self, prep: Prepared, idx: list[int], batch: PackedBatch, sh: Shard) -> losses.ValueInputs:
        dev = self.device
        self._checkpointing(self.critic, sh)
        values_N = critic_values(self.critic, sh.batch, dev).reshape(-1).index_select(0, sh.batch.action_index.to(dev))
        return losses.ValueInputs(
            values_N=values_N,
            old_values_N=actions_of([prep.values[i] for i in idx], batch)[sh.actions].to(dev),
            returns_N=actions_of([prep.returns[i] for i in idx], batch)[sh.actions].to(dev))

    def sft_step(self, seqs: Sequence[TrainSequence]) -> dict[str, float]:
        """Cross-entropy on the demonstrations' loss-mask tokens; one optimizer step."""
        nll = self._nll_backward(seqs, 1.0)
        self.policy.step()
        out: dict[str, float] = {} if nll is None else {"sft_nll": nll}
        out["grad_norm"] = _grad_norm(self.policy)
        out["action_tokens"] = float(sum(int(s.loss_mask[1:].sum()) for s in seqs))
        return out

    def _nll_backward(self, seqs: Sequence[TrainSequence], weight: float) -> float | None:
        """Backward of `weight` x the mean NLL of `seqs`' loss-mask tokens into the policy (no optimizer step);
        the mean NLL over every rank's share (None where no rank had a token)."""
        denom = float(sum(int(s.loss_mask[1:].sum()) for s in seqs))
        nll_sum: torch.Tensor | None = None
        tokens = 0
        for _, batch, scale in self._rank_batches(seqs):
            sh = shard(batch, self.sp)
            self._checkpointing(self.policy, sh)
            with self._replay(self.policy, sh):
                nll_N = -self._stats(self.policy, sh.batch, temperature=1.0).logp_N  # plain likelihood
                self.policy.backward(nll_N.sum() * (weight / max(denom, 1.0) * scale), scale_wrt_gas=False)
            if scale:
                part = nll_N.detach().sum()
                nll_sum = part if nll_sum is None else nll_sum + part
                tokens += sh.batch.num_actions
        if nll_sum is None:  # every rank of an SP group has real work or none
            return None
        nll_tokens = sum_over_group(torch.stack([nll_sum.double(), torch.tensor(float(tokens), dtype=torch.float64,
                                                                                 device=nll_sum.device)]), self.sp)
        return float(nll_tokens[0] / nll_tokens[1]) if nll_tokens[1] > 0 else None


def _grad_norm(engine: Any) -> float:
    norm = engine.get_global_grad_norm() if hasattr(engine, "get_global_grad_norm") else None
    if norm is None:
        return float("nan")
    return float(norm.item() if hasattr(norm, "item") else norm)
