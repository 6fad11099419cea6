"""Learning, not just running: a token bandit under PPO, critic warm-up, and train/infer logprob
agreement with routing replay. In-process TrainerCore on DeepSpeed ZeRO-2 (gloo, CPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_synth import PolicySampler, segment, trainer_config, trajectory

from t1.trainer.batch import build_sequences
from t1.trainer.core import Stage, TrainerCore
from t1.trajectory.serialization import encode_trajectory

PROMPT = [17, 230, 411, 97, 53]


def _push(core: TrainerCore, trajs) -> None:
    assert core.buffer is not None
    for t in trajs:
        assert core.buffer.add(t.id, t.group_id, encode_trajectory(t))


def _pick_arms(sampler: PolicySampler) -> tuple[int, int]:
    """Two ordinary tokens the initial policy finds about equally likely (restricted p near 0.5)."""
    logp, _ = sampler.next_token_logprobs(PROMPT)
    order = np.argsort(-logp[16:]) + 16
    top = order[:50]
    a = int(top[10])
    b = int(min(top[11:], key=lambda t: abs(logp[t] - logp[a])))
    return a, b


def test_ppo_raises_the_probability_of_the_better_action(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, group_size=4, lr=1e-5, groups_per_step=2,
                         advantage_norm="group", clip_eps=0.2)
    core = TrainerCore(cfg)
    rng = np.random.default_rng(0)
    sampler = PolicySampler(tiny_model_dir, 0)
    good, bad = _pick_arms(sampler)
    p0 = sampler.p_good(PROMPT, good, bad)
    history = [p0]
    for step in range(30):
        trajs = [sampler.bandit(f"s{step}-g{g}-{a}", f"s{step}-g{g}", PROMPT, good, bad, rng)
                 for g in range(2) for a in range(4)]
        _push(core, trajs)
        out = core.step(core.take_groups())
        assert out.stage == Stage.PPO and out.published is not None
        assert out.published.version == step + 1
        sampler = PolicySampler(out.published.path, out.published.version)
        history.append(sampler.p_good(PROMPT, good, bad))
    m = core.state.last_metrics
    for name in ("t1_train_infer_logprob_abs_diff", "clip_fraction", "approx_kl", "value_loss",
                 "explained_variance", "entropy", "policy_lag"):
        assert name in m
    assert m["t1_train_infer_logprob_abs_diff"] < 1e-5  # sampled at the version trained on, replayed
    assert history[-1] > 0.9 and history[-1] > p0 + 0.3, history
    assert np.mean(history[-5:]) > np.mean(history[:5])
    core.close()


def test_critic_warmup_learns_values_without_touching_the_policy(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Reward is 1 when the prompt starts with token 40, else 0: a critic can predict it exactly."""
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, group_size=2, groups_per_step=2, advantage_norm="none",
                         extra={"trainer.warm_start.critic_warmup_steps": 12, "trainer.warm_start.critic_lr": 3e-3,
                                "trainer.max_steps": 0})
    core = TrainerCore(cfg)
    before = {k: v.detach().clone() for k, v in core.policy.module.state_dict().items()}
    rng = np.random.default_rng(1)
    evs = []
    for step in range(12):
        assert core.stage() == Stage.CRITIC_WARMUP
        trajs = []
        for g in range(2):
            first = 40 if (step + g) % 2 == 0 else 41
            for a in range(2):
                ids = [first, *rng.integers(100, 900, size=3), *rng.integers(100, 900, size=3)]
                trajs.append(trajectory(f"{step}-{g}-{a}", f"{step}-{g}", [segment(ids, 4)],
                                        reward=1.0 if first == 40 else 0.0))
        _push(core, trajs)
        out = core.step(core.take_groups())
        assert out.published is None and out.state.policy_version == 0
        evs.append(out.state.last_metrics["explained_variance"])
    assert core.stage() == Stage.DONE
    after = core.policy.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert evs[0] == pytest.approx(0.0, abs=1e-6)  # zero-initialised value head
    assert max(evs[-3:]) > 0.5, evs
    core.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_replayed_trainer_logprobs_match_torch_backend_rollout(tmp_path: Path, tiny_model_dir: Path,
                                                              temperature: float) -> None:
    """Two turns from the float32 torch backend (routing captured), an observation between them:
    the trainer's pre-update logprobs with replay equal the behaviour logprobs within 1e-5
    (the trainer scores with the rollout's sampling temperature)."""
    from t1.inference.server.torch_backend import TorchBackend
    from t1.inference.types import GenerateRequest, SamplingParams

    async def rollout(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        backend = TorchBackend(tiny_model_dir)
        try:
            ids = list(np.random.default_rng(seed).integers(16, 1000, size=12))
            lps = [np.nan] * len(ids)
            rows: list[np.ndarray] = []
            for turn in range(2):
                req = GenerateRequest(session_id=f"s{seed}", prompt_ids=np.array(ids, np.int32),
                                      sampling=SamplingParams(temperature=temperature, max_tokens=6, seed=seed + turn))
                res = await backend(req)
                assert res.routing is not None and res.routing.start == sum(r.shape[0] for r in rows)
                rows.append(res.routing.experts)
                ids += [int(t) for t in res.token_ids]
                lps += [float(x) for x in res.logprobs]
                if turn == 0:
                    obs = [31, 32, 33]
                    ids += obs
                    lps += [np.nan] * len(obs)
            routing = np.concatenate(rows)
            assert routing.shape[0] == len(ids) - 1
            routing = np.concatenate([routing, np.full((1, *routing.shape[1:]), 255, routing.dtype)])
            lp = np.array(lps, np.float32)
            return np.array(ids, np.int32), lp, ~np.isnan(lp), routing
        finally:
            await backend.close()

    trajs = []
    for seed in (3, 4):
        ids, lp, mask, routing = asyncio.run(rollout(seed))
        seg = segment(ids, 1, version=0, routing=routing)
        seg.loss_mask[:] = mask
        seg.logprobs[:] = lp
        trajs.append(trajectory(f"t{seed}", "g", [seg], reward=1.0))
    core = TrainerCore(trainer_config(tmp_path / "work", tiny_model_dir,
                                      extra={"rollout.sampling.temperature": temperature}))
    seqs, _ = build_sequences([trajs], 0, 4, "drop_attempt", process_rewards=False)
    prep = core.learner.prepare(seqs)  # both sequences packed in one row
    assert prep.metrics["t1_routing_replay_coverage"] == 1.0
    for s, prox in zip(seqs, prep.prox_logp, strict=True):
        np.testing.assert_allclose(prox[s.loss_mask], s.behav_logp[s.loss_mask], atol=1e-5, rtol=0)
    assert prep.metrics["t1_train_infer_logprob_abs_diff"] < 1e-5
    core.close()
