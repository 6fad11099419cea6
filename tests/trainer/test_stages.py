"""Warm-start stages in order (SFT on demonstrations, critic warm-up, PPO) and checkpoint resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_synth import segment, trainer_config, trajectory

from t1.trainer.core import Stage, TrainerCore
from t1.trajectory.serialization import encode_trajectory


def _backbone_gap(core: TrainerCore) -> float:
    """Largest |policy backbone - critic backbone| over their parameters."""
    policy = core.policy.module.base_model.state_dict()
    critic = core.critic.module.backbone.state_dict()
    assert policy.keys() == critic.keys()
    return max(float((policy[k].float() - critic[k].float()).abs().max()) for k in policy)


def _rollouts(core: TrainerCore, step: int, version: int = 0) -> None:
    assert core.buffer is not None
    for g in range(2):
        for a in range(2):
            t = trajectory(f"{step}-{g}-{a}", f"{step}-{g}", [segment([20, 21, 22, 30 + a, 40], 3, version=version)],
                           reward=float(a))
            core.buffer.add(t.id, t.group_id, encode_trajectory(t))


def test_sft_then_critic_warmup_then_ppo(tmp_path: Path, tiny_model_dir: Path) -> None:
    demo_tokens = [11, 12, 13, 500, 501, 502, 503]
    demos = tmp_path / "demos.msgpack"
    with demos.open("wb") as f:
        for i in range(2):
            f.write(encode_trajectory(trajectory(f"demo{i}", "demo", [segment(demo_tokens, 3)], reward=1.0)))
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-3, extra={
        "trainer.warm_start.sft_steps": 4, "trainer.warm_start.demos_path": str(demos),
        "trainer.warm_start.critic_warmup_steps": 2, "trainer.max_steps": 1})
    core = TrainerCore(cfg)
    nll = []
    for i in range(4):
        assert core.stage() == Stage.SFT
        if i == 3:
            sft_moved = _backbone_gap(core)  # SFT moved the policy away from the model the critic was made of
        out = core.step(None)
        # SFT publishes where weights are awaited: its end (and a steered round's last step), not every step
        assert (out.published is not None and out.published.version == 4) if i == 3 else out.published is None
        nll.append(out.state.last_metrics["sft_nll"])
    assert nll[-1] < nll[0] * 0.7, nll
    # SFT's end: the critic's warm-up starts from the warm-started policy's backbone, restored so after a restart;
    # the policy's optimizer starts PPO without SFT's moments
    assert _backbone_gap(core) == 0.0
    assert not core.policy.optimizer.optimizer.state
    core.close()
    core = TrainerCore(cfg)
    assert core.stage() == Stage.CRITIC_WARMUP and _backbone_gap(core) == 0.0
    for i in range(2):
        assert core.stage() == Stage.CRITIC_WARMUP
        _rollouts(core, i, version=4)
        out = core.step(core.take_groups())
        assert out.published is None and out.state.policy_version == 4
    # the critic stepped from there (its zero head passes the backbone no gradient until the first step has moved it);
    # a stale optimizer master copy would have put the old backbone back
    assert 0.0 < _backbone_gap(core) < sft_moved / 4
    assert core.stage() == Stage.PPO and not core.policy.optimizer.optimizer.state
    _rollouts(core, 9, version=4)
    out = core.step(core.take_groups())
    assert core.policy.optimizer.optimizer.state
    assert out.published is not None and out.published.version == 5 and core.stage() == Stage.DONE
    assert [r.kind for r in core.buffer.steps()] == ["sft"] * 4 + ["critic_warmup"] * 2 + ["ppo"]
    core.close()


def test_restart_restores_weights_optimizer_and_counters(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-3, extra={"trainer.checkpoint_every": 2})
    core = TrainerCore(cfg)
    for i in range(3):
        _rollouts(core, i)
        core.step(core.take_groups())
    # steps 1-2 are committed with checkpoint step2; step 3 is not (checkpoint_every=2)
    core.close()
    again = TrainerCore(cfg)
    assert again.state.step == 2 and again.state.policy_version == 2 and again.state.checkpoint_tag == "step2"
    assert [p.version for p in again.publisher.published()] == [1, 2]  # v3 rolled back with its step
    assert again.buffer is not None
    pending = again.take_groups()
    assert pending is not None and [g for g, _ in pending] == ["2-0", "2-1"]  # step 3 is trained again
    from transformers import AutoModelForCausalLM

    published = AutoModelForCausalLM.from_pretrained(str(again.publisher.published()[-1].path)).state_dict()
    live = again.policy.module.state_dict()
    assert published.keys() == live.keys()
    assert all(torch.equal(published[k], live[k]) for k in published)
    adam_state = again.policy.optimizer.optimizer.state  # empty in a fresh engine until it steps
    assert any("exp_avg" in st for st in adam_state.values()), "optimizer state was not restored"
    out = again.step(pending)
    assert out.state.step == 3 and out.published is not None and out.published.version == 3
    assert np.isfinite(out.state.last_metrics["value_loss"])
    again.close()


def test_ppo_without_a_critic(tmp_path: Path, tiny_model_dir: Path) -> None:
    """rl.critic false (baseline group_turn): no critic engine, PPO steps the policy from the per-turn group baseline,
    checkpoints hold the policy alone and a restart resumes from them; a baseline that needs values is refused."""
    from t1.config.loader import ConfigError
    from t1.trajectory.types import TurnSpan

    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-3, baseline="group_turn", critic=False,
                         extra={"trainer.checkpoint_every": 1})
    core = TrainerCore(cfg)
    assert core.critic is None and core.learner.critic is None
    before = {k: v.clone() for k, v in core.policy.module.state_dict().items()}
    assert core.buffer is not None
    for g in range(2):
        for a in range(2):  # two turns each; attempt 1 earns more at its second turn
            seg = segment([20, 21, 22, 30 + a, 40, 23, 31 + a, 41], 3,
                          turns=(TurnSpan(3, 5, 0.0), TurnSpan(6, 8, float(a))))
            t = trajectory(f"0-{g}-{a}", f"0-{g}", [seg], reward=float(a))
            core.buffer.add(t.id, t.group_id, encode_trajectory(t))
    out = core.step(core.take_groups())
    metrics = out.state.last_metrics
    assert np.isfinite(metrics["policy_loss"]) and metrics["policy_loss"] != 0.0
    assert "value_loss" not in metrics and "explained_variance" not in metrics
    assert _max_gap(before, core.policy.module.state_dict()) > 0
    assert not (tmp_path / "work" / "checkpoints" / "critic").exists()
    core.close()
    again = TrainerCore(cfg)
    assert again.critic is None and again.state.step == 1 and again.state.checkpoint_tag == "step1"
    again.close()
    with pytest.raises(ConfigError, match=r"rl.critic false needs rl.baseline group_turn: baseline 'critic'"):
        trainer_config(tmp_path, tiny_model_dir, critic=False)
    with pytest.raises(ConfigError, match=r"rl.critic false: warm_start.critic_warmup_steps must be 0"):
        trainer_config(tmp_path, tiny_model_dir, baseline="group_turn", critic=False,
                       extra={"trainer.warm_start.critic_warmup_steps": 2})


def _first_ppo_step_size(tmp_path: Path, tiny_model_dir: Path, warmup: int) -> tuple[float, list[float]]:
    """The largest weight change of a PPO step taken from reset optimizer moments, and each step's policy lr."""
    cfg = trainer_config(tmp_path / f"work{warmup}", tiny_model_dir, lr=1e-3, lr_warmup_steps=warmup,
                         extra={"trainer.max_steps": 3})
    core = TrainerCore(cfg)
    before = {k: v.detach().clone() for k, v in core.policy.module.named_parameters()}
    lrs = []
    for step in range(3):
        _rollouts(core, step)
        out = core.step(core.take_groups())
        lrs.append(out.state.last_metrics["policy_lr"])
        if step == 0:
            moved = max(float((p.detach() - before[k]).abs().max()) for k, p in core.policy.module.named_parameters())
    assert [g["lr"] for g in core.policy.optimizer.param_groups] == [1e-3] * len(core.policy.optimizer.param_groups)
    core.close()
    return moved, lrs


def test_ppo_lr_warmup(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Adam's first step from reset moments moves weights by about lr whatever the gradient's size; with
    rl.lr_warmup_steps 2 the first PPO steps take 1/3 and 2/3 of it, and the optimizer keeps its own lr after."""
    full, full_lrs = _first_ppo_step_size(tmp_path, tiny_model_dir, 0)
    warm, warm_lrs = _first_ppo_step_size(tmp_path, tiny_model_dir, 2)
    assert full_lrs == [1e-3] * 3
    assert np.allclose(warm_lrs, [1e-3 / 3, 2e-3 / 3, 1e-3])
    assert full == pytest.approx(1e-3, rel=0.05) and warm == pytest.approx(1e-3 / 3, rel=0.05), (full, warm)


def _ptx_nll(tmp_path: Path, model_dir: Path, coef: float) -> list[float]:
    """The ptx_nll metric (the demonstrations' NLL before each step's update) of three PPO steps on the same
    rollouts, with PPO-ptx at `coef`."""
    demos = tmp_path / f"demos-{coef}.msgpack"
    with demos.open("wb") as f:
        for i in range(2):
            f.write(encode_trajectory(trajectory(f"demo{i}", "demo", [segment([11, 12, 13, 500, 501, 502], 3)], 1.0)))
    cfg = trainer_config(tmp_path / f"work-{coef}", model_dir, lr=1e-3, demo_nll_coef=coef, ppo_epochs=2,
                         extra={"trainer.warm_start.demos_path": str(demos)})
    core = TrainerCore(cfg)
    nll = []
    for step in range(3):
        _rollouts(core, step, version=step)
        nll.append(core.step(core.take_groups()).state.last_metrics["ptx_nll"])
    core.close()
    return nll


def test_ppo_ptx_keeps_training_the_demonstrations(tmp_path: Path, tiny_model_dir: Path) -> None:
    """rl.demo_nll_coef adds the demonstrations' NLL to each PPO epoch's policy loss: on the same rollouts their
    NLL falls step by step, where with a negligible coefficient PPO alone leaves it about where it was."""
    alone = _ptx_nll(tmp_path, tiny_model_dir, 1e-9)
    ptx = _ptx_nll(tmp_path, tiny_model_dir, 1.0)
    assert alone[0] == pytest.approx(ptx[0])  # the same model before the first update
    assert ptx[2] < ptx[1] < ptx[0], ptx
    assert ptx[2] < alone[2] - 0.1 * abs(alone[0]), (ptx, alone)


def test_ppo_ptx_needs_demonstrations(tmp_path: Path, tiny_model_dir: Path) -> None:
    from t1.config.loader import ConfigError

    with pytest.raises(ConfigError, match=r"demo_nll_coef > 0 needs warm_start.demos_path"):
        trainer_config(tmp_path, tiny_model_dir, demo_nll_coef=0.5)


def test_ppo_ptx_leaves_out_the_tasks_it_is_told_to(tmp_path: Path, tiny_model_dir: Path) -> None:
    """rl.ptx_skip_tasks: PPO-ptx's batches hold no segment of a matching task's demonstration (the teacher's copies
    of a choice only the reward should teach), SFT's still do; a pattern that leaves PPO-ptx nothing is an error."""
    from t1.config.loader import ConfigError

    walk, shortcut = [11, 12, 13, 500, 501, 502], [11, 12, 13, 600, 601]
    demos = tmp_path / "demos.msgpack"
    with demos.open("wb") as f:
        for i, (task, tokens) in enumerate([("fc-1", walk), ("fc-1-s0", shortcut), ("fc-1-s1", shortcut),
                                            ("fc-2", walk)]):
            t = trajectory(f"demo{i}", "demo", [segment(tokens, 3), segment(tokens, 3)], 1.0)
            f.write(encode_trajectory(replace(t, task_id=task)))
    extra = {"trainer.warm_start.demos_path": str(demos), "trainer.warm_start.sft_batch": 2}
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-3, demo_nll_coef=0.5, ppo_epochs=8,
                         ptx_skip_tasks="-s[0-9]+$", extra=extra)
    core = TrainerCore(cfg)
    assert len(core.demos) == 8 and len(core.ptx_demos) == 4
    batches = core._ptx_batches()
    assert len(batches) == 8 and all(len(b) == 2 for b in batches)
    assert all(seq.token_ids.tolist() == walk for b in batches for seq in b)
    _rollouts(core, 0)
    assert core.step(core.take_groups()).state.last_metrics["ptx_nll"] > 0
    core.close()
    cfg = trainer_config(tmp_path / "work-all", tiny_model_dir, lr=1e-3, demo_nll_coef=0.5, ppo_epochs=8,
                         extra=extra)
    core = TrainerCore(cfg)
    assert {tuple(seq.token_ids.tolist()) for b in core._ptx_batches() for seq in b} == {tuple(walk), tuple(shortcut)}
    core.close()
    with pytest.raises(ValueError, match=r"ptx_skip_tasks 'fc-' matches every demonstration's task \(4 tasks\)"):
        TrainerCore(trainer_config(tmp_path / "work-none", tiny_model_dir, demo_nll_coef=0.5, ptx_skip_tasks="fc-",
                                   extra=extra))
    with pytest.raises(ConfigError, match=r"ptx_skip_tasks '-s\[0-9' is not a regular expression"):
        trainer_config(tmp_path, tiny_model_dir, demo_nll_coef=0.5, ptx_skip_tasks="-s[0-9", extra=extra)


def _max_gap(a: torch.nn.Module | dict[str, torch.Tensor], b: torch.nn.Module | dict[str, torch.Tensor]) -> float:
    sa = a if isinstance(a, dict) else a.state_dict()
    sb = b if isinstance(b, dict) else b.state_dict()
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)


def test_kl_reference_is_the_warm_start(tmp_path: Path, tiny_model_dir: Path) -> None:
    """With rl.kl_coef, PPO is held near the policy SFT made, not near the model SFT began with: at SFT's end the
    reference takes the policy's weights, and a restarted trainer loads that reference, not the starting model."""
    demos = tmp_path / "demos.msgpack"
    with demos.open("wb") as f:
        f.write(encode_trajectory(trajectory("demo0", "demo", [segment([11, 12, 13, 500, 501, 502], 3)], 1.0)))
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-3, kl_coef=0.1, extra={
        "trainer.warm_start.sft_steps": 2, "trainer.warm_start.demos_path": str(demos), "trainer.max_steps": 1})
    core = TrainerCore(cfg)
    reference = core.learner.reference
    assert reference is not None
    core.step(None)
    assert _max_gap(core.policy.module, reference) > 1e-4  # SFT moved the policy; the reference is the start
    core.step(None)
    assert core.stage() == Stage.PPO and _max_gap(core.policy.module, reference) == 0.0
    warm = {k: v.clone() for k, v in reference.state_dict().items()}
    _rollouts(core, 0, version=2)
    core.step(core.take_groups())
    assert _max_gap(core.policy.module, reference) > 0.0  # PPO moves the policy, never the reference
    core.close()
    again = TrainerCore(cfg)
    assert again.learner.reference is not None
    assert all(torch.equal(v, warm[k]) for k, v in again.learner.reference.state_dict().items())
    again.close()
