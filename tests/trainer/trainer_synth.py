"""Helpers of the trainer tests: configs for a tiny CPU run and synthetic trajectories."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t1.config import T1Config
from t1.config.loader import validate
from t1.trainer.batch import TrainSequence
from t1.trajectory.types import EpisodeStatus, Segment, Trajectory, TurnSpan


def trainer_config(work_dir: Path, model_dir: Path, *, group_size: int = 2, lr: float = 1e-3,
                   stage: int = 2, extra: dict[str, Any] | None = None, **rl: Any) -> T1Config:
    """A config for a tiny CPU run: ZeRO `stage`, fp32, torch Adam, no metrics server."""
    data: dict[str, Any] = {
        "rollout": {"group_size": group_size},
        "metrics": {"port": None},
        "trainer": {
            "work_dir": str(work_dir), "policy_path": str(model_dir), "max_steps": 100, "seed": 0,
            "server": {"host": "127.0.0.1", "port": 0, "grace_s": 0.5},
            "rl": {"groups_per_step": 2, "token_budget": 256, "max_policy_lag": 4, **rl},
            "deepspeed": {
                "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                "zero_optimization": {"stage": stage}, "bf16": {"enabled": False},
                "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
            },
        },
    }
    for key, value in (extra or {}).items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return validate(data)


def segment(token_ids: Sequence[int], sampled_from: int, logprobs: Sequence[float] | None = None,
            version: int = 0, routing: np.ndarray | None = None,
            turns: tuple[TurnSpan, ...] = ()) -> Segment:
    """A segment whose tokens from `sampled_from` on were sampled (loss mask), at policy `version`."""
    ids = np.asarray(token_ids, dtype=np.int32)
    n = ids.shape[0]
    mask = np.zeros(n, dtype=bool)
    mask[sampled_from:] = True
    lp = np.full(n, np.nan, dtype=np.float32)
    lp[sampled_from:] = -1.0 if logprobs is None else np.asarray(logprobs, dtype=np.float32)
    versions = np.where(mask, version, -1).astype(np.int32)
    return Segment(token_ids=ids, logprobs=lp, loss_mask=mask, policy_versions=versions, routing=routing, turns=turns)


def trajectory(tid: str, group: str, segments: Sequence[Segment], reward: float,
               status: EpisodeStatus = EpisodeStatus.OK, attempt: int = 0) -> Trajectory:
    return Trajectory(id=tid, task_id="task", group_id=group, attempt=attempt, segments=tuple(segments),
                      reward=reward, status=status)


class PolicySampler:
    """Samples from a published policy folder like a float32 inference server: behaviour logprobs
    from the full softmax, routing recorded for every input position (none for the last token)."""

    def __init__(self, folder: Path, version: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.version = version

    def next_token_logprobs(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(log p(next | ids) over the vocabulary, routing [len(ids), layers, top_k])."""
        import torch

        from t1.routing.capture import capture_routing

        with torch.no_grad(), capture_routing(self.model) as cap:
            logits = self.model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, -1]
        return torch.log_softmax(logits.float(), -1).numpy(), cap.concatenated()

    def bandit(self, tid: str, group: str, prompt: Sequence[int], good: int, bad: int,
               rng: np.random.Generator) -> Trajectory:
        """Choose `good` or `bad` in proportion to their probabilities; reward 1 for `good`."""
        logp, routing = self.next_token_logprobs(prompt)
        p_good = 1.0 / (1.0 + np.exp(logp[bad] - logp[good]))
        act = good if rng.random() < p_good else bad
        full = np.concatenate([routing, np.full((1, *routing.shape[1:]), 255, routing.dtype)])
        seg = segment([*prompt, act], len(prompt), [logp[act]], version=self.version, routing=full)
        return trajectory(tid, group, [seg], reward=1.0 if act == good else 0.0)

    def p_good(self, prompt: Sequence[int], good: int, bad: int) -> float:
        logp, _ = self.next_token_logprobs(prompt)
        return float(1.0 / (1.0 + np.exp(logp[bad] - logp[good])))


def routed_sequences(num_experts: int, layers: int, top_k: int, lengths: Sequence[int] = (13, 7, 21),
                     seed: int = 0) -> list[TrainSequence]:
    """Sequences of the given lengths, actions from a third on (one observation token among them);
    routing is random (not what the live router picks), the last token's row missing."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = rng.integers(16, 1000, size=n).astype(np.int32)
        mask = np.zeros(n, bool)
        mask[n // 3:] = True
        mask[n // 3 + 1] = False  # an observation token inside the action region
        routing = np.stack([np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(layers)])
                            for _ in range(n)]).astype(np.uint8)
        routing[-1] = 255  # the last token is never an input
        out.append(TrainSequence(f"t{i}", "g", 0, ids, np.zeros(n, np.float32), mask, np.zeros(n, np.int32),
                                 routing, np.zeros(n, np.float32)))
    return out


def take_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameter gradients (copies), then zeroed."""
    out = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out
