"""Rewards to advantages, as pure numpy functions: reward placement, GAE, normalisation.

Everything here works on *action tokens*: the positions a sampler produced (loss mask True).
Observation and template tokens between turns are environment, not actions: they get no reward,
no value target and no advantage, and GAE steps over them as if they were not there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np

from t1.trajectory.types import TurnSpan

AdvantageNorm = Literal["global", "group", "group_centered", "none"]


def place_rewards(
    loss_masks: Sequence[np.ndarray],
    turns: Sequence[Sequence[TurnSpan]],
    episode_reward: float,
    process_rewards: bool,
) -> list[np.ndarray]:
    """Per-token rewards for each segment of one episode (float32, same length as each mask).

    Without process rewards the whole episode reward sits on the episode's last action token.
    With them, each turn's reward sits on that turn's last action token, and what the turns did
    not account for (episode_reward - sum of turn rewards) sits on the last action token, so the
    undiscounted return of the episode is always exactly the episode reward.
    """
    if len(loss_masks) != len(turns):
        raise ValueError(f"{len(loss_masks)} loss masks but {len(turns)} turn lists")
    rewards = [np.zeros(m.shape[0], dtype=np.float32) for m in loss_masks]
    last = _last_action(loss_masks)
    if last is None:
        return rewards
    residual = float(episode_reward)
    if process_rewards:
        for seg, (mask, spans) in enumerate(zip(loss_masks, turns, strict=True)):
            for span in spans:
                if not 0 <= span.start <= span.end <= mask.shape[0]:
                    raise ValueError(f"turn span [{span.start}, {span.end}) outside segment {seg} of {mask.shape[0]} "
                                     "tokens")
                actions = np.flatnonzero(mask[span.start:span.end])
                if span.reward == 0.0:
                    continue
                if actions.size == 0:
                    raise ValueError(f"turn [{span.start}, {span.end}) of segment {seg} has reward {span.reward} but "
                                     "no action token")
                rewards[seg][span.start + int(actions[-1])] += span.reward
                residual -= span.reward
    seg, pos = last
    rewards[seg][pos] += residual
    return rewards


def _last_action(loss_masks: Sequence[np.ndarray]) -> tuple[int, int] | None:
    for seg in range(len(loss_masks) - 1, -1, -1):
        actions = np.flatnonzero(loss_masks[seg])
        if actions.size:
            return seg, int(actions[-1])
    return None


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE over one episode's action tokens in order; the episode ends after the last one.

    rewards, values: float [T]. Returns (advantages, returns) float32 [T], returns = advantages + values.
    The value after the last token is 0 (terminal): bootstrapping happens only inside the episode.
    """
    if rewards.shape != values.shape or rewards.ndim != 1:
        raise ValueError(f"rewards {rewards.shape} and values {values.shape} must be equal 1-D shapes")
    num = rewards.shape[0]
    adv = np.zeros(num, dtype=np.float64)
    running = 0.0
    for t in range(num - 1, -1, -1):
        next_value = float(values[t + 1]) if t + 1 < num else 0.0
        delta = float(rewards[t]) + gamma * next_value - float(values[t])
        running = delta + gamma * lam * running
        adv[t] = running
    return adv.astype(np.float32), (adv + values).astype(np.float32)


def episode_gae(
    loss_masks: Sequence[np.ndarray],
    rewards: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    gamma: float,
    lam: float,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GAE across all segments of one episode (segments chain: the last action of one bootstraps
    from the first action of the next). Arrays are per position; non-action positions get 0."""
    idx = [np.flatnonzero(m) for m in loss_masks]
    flat_r = np.concatenate([r[i] for r, i in zip(rewards, idx, strict=True)]) if idx else np.zeros(0)
    flat_v = np.concatenate([v[i] for v, i in zip(values, idx, strict=True)]) if idx else np.zeros(0)
    flat_a, flat_ret = gae(flat_r.astype(np.float32), flat_v.astype(np.float32), gamma, lam)
    advs, rets, offset = [], [], 0
    for mask, i in zip(loss_masks, idx, strict=True):
        a = np.zeros(mask.shape[0], dtype=np.float32)
        r = np.zeros(mask.shape[0], dtype=np.float32)
        a[i] = flat_a[offset:offset + i.size]
        r[i] = flat_ret[offset:offset + i.size]
        offset += i.size
        advs.append(a)
        rets.append(r)
    return advs, rets


def normalize_advantages(
    advantages: Sequence[np.ndarray], masks: Sequence[np.ndarray], group_ids: Sequence[str],
    mode: AdvantageNorm, eps: float = 1e-8,
) -> list[np.ndarray]:
    """Whiten advantages over action tokens: over the whole batch, within each group, or not at all;
    `group_centered`: each group's mean subtracted (a baseline of the task's own attempts), then one scale for
    the batch, its std after centring. Unlike `group`, a group whose attempts did equally well keeps its small
    advantages small instead of being blown up to unit spread.

    A group (or batch) whose advantages are all equal is centred but not scaled.
    """
    if not len(advantages) == len(masks) == len(group_ids):
        raise ValueError("advantages, masks and group_ids must have one entry per sequence")
    if mode == "none":
        return [a.copy() for a in advantages]
    if mode == "group_centered":
        return _scale(_centre_groups(advantages, masks, group_ids), masks, eps)
    keys = list(group_ids) if mode == "group" else ["*"] * len(advantages)
    out = [a.astype(np.float32).copy() for a in advantages]
    for key in dict.fromkeys(keys):
        members = [i for i, k in enumerate(keys) if k == key]
        vals = np.concatenate([advantages[i][masks[i]] for i in members])
        if vals.size == 0:
            continue
        mean, std = float(vals.mean()), float(vals.std())
        for i in members:
            scaled = (advantages[i] - mean) / (std + eps) if std > eps else advantages[i] - mean
            out[i] = np.where(masks[i], scaled, 0.0).astype(np.float32)
    return out


def _centre_groups(advantages: Sequence[np.ndarray], masks: Sequence[np.ndarray], group_ids: Sequence[str]
                   ) -> list[np.ndarray]:
    """Each group's action-token mean subtracted; positions outside the masks set to 0."""
    out = [np.where(m, a, 0.0).astype(np.float32) for a, m in zip(advantages, masks, strict=True)]
    for key in dict.fromkeys(group_ids):
        members = [i for i, k in enumerate(group_ids) if k == key]
        vals = np.concatenate([advantages[i][masks[i]] for i in members])
        if vals.size:
            mean = float(vals.mean())
            for i in members:
                out[i] = np.where(masks[i], advantages[i] - mean, 0.0).astype(np.float32)
    return out


def _scale(advantages: list[np.ndarray], masks: Sequence[np.ndarray], eps: float) -> list[np.ndarray]:
    """Divided by the std of all action tokens (unchanged when they have no spread)."""
    vals = np.concatenate([a[m] for a, m in zip(advantages, masks, strict=True)]) if advantages else np.zeros(0)
    std = float(vals.std()) if vals.size else 0.0
    return [(a / (std + eps)).astype(np.float32) if std > eps else a for a in advantages]


def group_turn_advantages(
    masks: Sequence[np.ndarray], rewards: Sequence[np.ndarray], turn_ids: Sequence[np.ndarray],
    episodes: Sequence[str], segments: Sequence[int], groups: Sequence[str], gamma: float,
) -> list[np.ndarray]:
    """Advantages with a per-turn group baseline instead of a critic (`rl.baseline: group_turn`), per sequence (one
    segment each, in any order; `episodes`, `segments`, `groups` say whose and which).

    An action token of turn k gets its return-to-go (discounted by gamma per action token, no bootstrapping)
    minus the mean, over the other episodes of its group that reached turn k, of their return-to-go at the first
    token of turn k (leave-one-out: no episode is its own baseline); 0 where no other episode reached turn k
    (nothing to compare it with). With process rewards a return-to-go shrinks as the episode goes on, so a
    baseline of about one value per episode (a critic that has not yet learnt the states) gives every early turn
    a positive advantage and every late one a negative one whatever they did; this one compares turn k with
    turn k. Turn ids number an episode's generations across its segments (t1/trainer/batch.py)."""
    n = len(masks)
    if not len(rewards) == len(turn_ids) == len(episodes) == len(segments) == len(groups) == n:
        raise ValueError("masks, rewards, turn_ids, episodes, segments and groups need one entry per sequence")
    members: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        members[ep].append(i)
    rtg: list[np.ndarray] = [np.zeros(0, np.float32)] * n
    starts: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # episode -> (its turns, return-to-go at their first token)
    for ep, idx in members.items():
        idx.sort(key=lambda i: segments[i])
        zeros = [np.zeros(masks[i].shape[0], np.float32) for i in idx]
        returns, _ = episode_gae([masks[i] for i in idx], [rewards[i] for i in idx], zeros, gamma, 1.0)
        for j, i in enumerate(idx):
            rtg[i] = returns[j]
        ks = np.concatenate([turn_ids[i][masks[i]] for i in idx]).astype(np.int64)
        rs = np.concatenate([rtg[i][masks[i]] for i in idx]).astype(np.float64)
        turns, first = np.unique(ks, return_index=True)  # in segment order: a turn's first token is met first
        starts[ep] = (turns[turns >= 0], rs[first[turns >= 0]])
    size = max((int(t[-1]) + 1 for t, _ in starts.values() if t.size), default=0)
    total: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(size))  # group -> turn -> sum of starts
    count: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(size))  # group -> turn -> episodes reaching it
    for ep, (turns, r) in starts.items():
        g = groups[members[ep][0]]
        total[g][turns] += r
        count[g][turns] += 1
    out = []
    for i in range(n):
        adv = np.zeros(masks[i].shape[0], np.float32)
        pos = np.flatnonzero(masks[i])
        k = turn_ids[i][pos].astype(np.int64)
        turns, r = starts[episodes[i]]
        own = np.zeros(size)
        own[turns] = r
        kk = np.maximum(k, 0)
        c = count[groups[i]][kk]
        ok = (k >= 0) & (c >= 2)
        base = (total[groups[i]][kk] - own[kk]) / np.maximum(c - 1, 1)
        adv[pos[ok]] = rtg[i][pos[ok]] - base[ok]
        out.append(adv)
    return out
