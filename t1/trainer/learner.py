"""One optimisation step on DeepSpeed engines: PPO actor-critic, critic-only warm-up, and SFT.

A step is: (1) a no-grad pass with the pre-update policy (routing replayed) and critic giving the
proximal logprobs and old values; (2) rewards -> GAE -> normalised advantages; (3) per PPO epoch,
every token-budget micro-batch is forwarded and backpropagated (losses averaged over the step's
action tokens), then one engine.step() per engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from t1.config.trainer import RlConfig
from t1.trainer import losses
from t1.trainer.advantages import episode_gae, normalize_advantages
from t1.trainer.batch import TrainSequence, micro_batches
from t1.trainer.engine import rank, world_size
from t1.trainer.models import (
    PaddedBatch,
    maybe_replay,
    pad_batch,
    per_position,
    policy_logits,
    to_target_aligned,
)


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """Pre-update quantities per sequence (position-aligned arrays of length N)."""

    prox_logp: list[np.ndarray]
    values: list[np.ndarray]
    advantages: list[np.ndarray]
    returns: list[np.ndarray]
    metrics: dict[str, float]


class _Sums:
    """Token-weighted running means of per-micro-batch metrics."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.weight: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: float, weight: float) -> None:
        if weight > 0 and np.isfinite(value):
            self.total[name] += value * weight
            self.weight[name] += weight

    def means(self) -> dict[str, float]:
        return {k: self.total[k] / self.weight[k] for k in self.total if self.weight[k] > 0}


class Learner:
    """Owns the policy and critic engines (and an optional frozen reference) and steps them."""

    def __init__(self, policy: Any, critic: Any | None, rl: RlConfig, device: torch.device,
                 reference: torch.nn.Module | None = None, temperature: float = 1.0) -> None:
        self.policy, self.critic, self.rl, self.device, self.reference = policy, critic, rl, device, reference
        # Behaviour logprobs are of the sampling distribution: logits / temperature (0 = greedy: none).
        self.temperature = temperature if temperature > 0 else 1.0

    def _logits(self, model: Any, batch: PaddedBatch) -> torch.Tensor:
        # float32 before the temperature, as the sampler does (a bf16 division alone costs ~0.01 |dlogp|).
        logits = policy_logits(model, batch, self.device).float()
        return logits if self.temperature == 1.0 else logits / self.temperature

    def _batches(self, seqs: Sequence[TrainSequence]) -> list[tuple[list[int], PaddedBatch]]:
        groups = micro_batches([s.num_tokens for s in seqs], self.rl.token_budget)
        return [(idx, pad_batch([seqs[i] for i in idx])) for idx in groups]

    def _rank_batches(self, seqs: Sequence[TrainSequence]) -> list[tuple[list[int], PaddedBatch, float]]:
        """This rank's share of the micro-batches, with a loss scale.

        Ranks take micro-batches round robin; every rank runs the same number of backward passes
        (ZeRO reduces in them), a rank short of work repeats one at scale 0. The scale of real work
        is the world size because DeepSpeed averages gradients over ranks.
        """
        all_batches = self._batches(seqs)
        ws, r = world_size(), rank()
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
        prox: list[np.ndarray] = [np.zeros(0, np.float32)] * n
        values: list[np.ndarray] = [np.zeros(s.num_tokens, np.float32) for s in seqs]
        sums = _Sums()
        for idx, batch in self._batches(seqs):
            with maybe_replay(self.policy, batch, self.rl.routing_replay) as stats:
                logits = self._logits(self.policy, batch)
            logp = losses.token_logprobs(logits, batch.targets.to(self.device))
            for i, arr in zip(idx, per_position(logp, batch.lengths), strict=True):
                prox[i] = arr
            if stats is not None:
                rows = stats.replayed_rows + stats.fallback_rows
                sums.add("t1_routing_replay_coverage", stats.coverage, rows)
                sums.add("t1_router_disagreement_rate", stats.disagreement_rate, stats.compared_slots)
            if self.critic is not None:
                v = self.critic(batch.input_ids.to(self.device), batch.attention_mask.to(self.device))
                for i, arr in zip(idx, per_position(v, batch.lengths), strict=True):
                    values[i] = arr
        metrics = sums.means()
        masks = [s.loss_mask for s in seqs]
        diffs = np.concatenate([np.abs(p[m] - s.behav_logp[m]) for p, m, s in zip(prox, masks, seqs, strict=True)])
        metrics["t1_train_infer_logprob_abs_diff"] = float(diffs.mean()) if diffs.size else 0.0
        metrics["t1_train_infer_logprob_abs_diff_max"] = float(diffs.max()) if diffs.size else 0.0
        advs, rets = self._advantages(seqs, values)
        v_all = np.concatenate([v[m] for v, m in zip(values, masks, strict=True)])
        r_all = np.concatenate([r[m] for r, m in zip(rets, masks, strict=True)])
        metrics["explained_variance"] = losses.explained_variance(
            torch.from_numpy(v_all), torch.from_numpy(r_all), torch.ones(v_all.shape[0], dtype=torch.bool))
        metrics["value_mean"] = float(v_all.mean()) if v_all.size else 0.0
        metrics["return_mean"] = float(r_all.mean()) if r_all.size else 0.0
        return Prepared(prox, values, advs, rets, metrics)

    def _advantages(self, seqs: Sequence[TrainSequence], values: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
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
        normed = normalize_advantages(advs, [s.loss_mask for s in seqs], [s.group_id for s in seqs],
                                      self.rl.advantage_norm)
        return normed, rets

    def ppo_step(self, seqs: Sequence[TrainSequence], prep: Prepared, update_policy: bool) -> dict[str, float]:
        """PPO epochs over the batch; the policy is updated only when update_policy (else critic only)."""
        denom = float(sum(int(s.loss_mask[1:].sum()) for s in seqs))
        sums = _Sums()
        batches = self._rank_batches(seqs)
        for _ in range(self.rl.ppo_epochs):
            for idx, batch, scale in batches:
                ntok = float(batch.loss_mask.sum()) if scale > 0 else 0.0
                if update_policy:
                    self._policy_micro(seqs, prep, idx, batch, denom / scale if scale else 1.0, ntok, sums, scale)
                if self.critic is not None:
                    self._critic_micro(prep, idx, batch, denom / scale if scale else 1.0, ntok, sums, scale)
            if update_policy:
                self.policy.step()
                sums.add("grad_norm", _grad_norm(self.policy), 1.0)
            if self.critic is not None:
                self.critic.step()
        out = sums.means()
        out["action_tokens"] = denom
        return out

    def _policy_micro(self, seqs: Sequence[TrainSequence], prep: Prepared, idx: list[int], batch: PaddedBatch,
                      denom: float, ntok: float, sums: _Sums, scale: float) -> None:
        dev, shape = self.device, (int(batch.input_ids.shape[0]), int(batch.input_ids.shape[1]))
        mask = batch.loss_mask.to(dev)
        prox = to_target_aligned([prep.prox_logp[i] for i in idx], shape).to(dev)
        behav = to_target_aligned([seqs[i].behav_logp for i in idx], shape).to(dev)
        adv = to_target_aligned([prep.advantages[i] for i in idx], shape).to(dev)
        with maybe_replay(self.policy, batch, self.rl.routing_replay):
            logits = self._logits(self.policy, batch)
            logp = losses.token_logprobs(logits, batch.targets.to(dev))
            out = losses.ppo_policy_loss(logp, prox, behav, adv, mask, self.rl.clip_eps, self.rl.clip_eps_high,
                                         self.rl.is_truncation, denom)
            loss = out.loss
            entropy = losses.token_entropy(logits)
            if self.rl.entropy_coef > 0:
                loss = loss - self.rl.entropy_coef * losses.masked_mean(entropy, mask.float(), denom)
            if self.reference is not None and self.rl.kl_coef > 0:
                with torch.no_grad(), maybe_replay(self.reference, batch, self.rl.routing_replay):
                    ref_logp = losses.token_logprobs(self._logits(self.reference, batch), batch.targets.to(dev))
                kl = losses.kl_to_reference(logp, ref_logp)
                loss = loss + self.rl.kl_coef * losses.masked_mean(kl, mask.float(), denom)
                sums.add("kl_ref", float(losses.masked_mean(kl.detach(), mask.float())), ntok)
            self.policy.backward(loss * (1.0 if scale else 0.0), scale_wrt_gas=False)
        sums.add("policy_loss", float(out.loss.detach()) * denom / max(ntok, 1.0), ntok)
        sums.add("clip_fraction", out.clip_fraction, ntok)
        sums.add("approx_kl", out.approx_kl, ntok)
        sums.add("kl", out.approx_kl, ntok)
        sums.add("is_weight_mean", out.is_weight_mean, ntok)
        sums.add("is_truncated_fraction", out.is_truncated_fraction, ntok)
        sums.add("entropy", float(losses.masked_mean(entropy.detach(), mask.float())), ntok)

    def _critic_micro(self, prep: Prepared, idx: list[int], batch: PaddedBatch, denom: float, ntok: float,
                      sums: _Sums, scale: float) -> None:
        assert self.critic is not None
        dev, shape = self.device, (int(batch.input_ids.shape[0]), int(batch.input_ids.shape[1]))
        mask = batch.loss_mask.to(dev)
        old_v = to_target_aligned([prep.values[i] for i in idx], shape).to(dev)
        rets = to_target_aligned([prep.returns[i] for i in idx], shape).to(dev)
        v = self.critic(batch.input_ids.to(dev), batch.attention_mask.to(dev))
        loss = losses.value_loss(v, old_v, rets, mask, self.rl.value_clip_eps, denom)
        self.critic.backward(self.rl.value_coef * loss * (1.0 if scale else 0.0), scale_wrt_gas=False)
        sums.add("value_loss", float(loss.detach()) * denom / max(ntok, 1.0), ntok)

    def sft_step(self, seqs: Sequence[TrainSequence]) -> dict[str, float]:
        """Cross-entropy on the demonstrations' loss-mask tokens; one optimizer step."""
        denom = float(sum(int(s.loss_mask[1:].sum()) for s in seqs))
        sums = _Sums()
        for _, batch, scale in self._rank_batches(seqs):
            mask = batch.loss_mask.to(self.device)
            with maybe_replay(self.policy, batch, self.rl.routing_replay):
                logits = policy_logits(self.policy, batch, self.device)  # SFT: plain likelihood
                nll = -losses.token_logprobs(logits, batch.targets.to(self.device))
                loss = losses.masked_mean(nll, mask.float(), denom) * scale
                self.policy.backward(loss, scale_wrt_gas=False)
            if scale:
                sums.add("sft_nll", float(losses.masked_mean(nll.detach(), mask.float())), float(mask.sum()))
        self.policy.step()
        out = sums.means()
        out["grad_norm"] = _grad_norm(self.policy)
        out["action_tokens"] = denom
        return out


def _grad_norm(engine: Any) -> float:
    norm = engine.get_global_grad_norm() if hasattr(engine, "get_global_grad_norm") else None
    if norm is None:
        return float("nan")
    return float(norm.item() if hasattr(norm, "item") else norm)
