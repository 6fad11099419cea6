"""The warm start's SFT lifecycle, outside the core's step loop: which demonstrations a step trains on, its
learning rate, the weights a steered SFT goes back to, and the KL reference anchored at SFT's end.

TrainerCore (core.py) runs the stages and calls these; they hold no state of their own.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from t1.config.trainer import TrainerConfig, WarmStartConfig
from t1.trainer import engine as ds
from t1.trainer.batch import TrainSequence
from t1.trainer.models import load_policy
from t1.trainer.publish import Publisher

log = logging.getLogger(__name__)

REFERENCE_DIR = "reference"  # work_dir/reference: the KL reference (the warm start) once SFT has ended


def sft_batch(demos: list[TrainSequence], size: int | None, step: int, seed: int) -> list[TrainSequence]:
    """The demonstrations of SFT step `step`: consecutive slices of one shuffle per epoch (pure; the same on
    every rank and after a restart)."""
    if size is None or size >= len(demos):
        return demos
    start = step * size
    out: list[TrainSequence] = []
    while len(out) < size:
        epoch, offset = divmod(start + len(out), len(demos))
        order = np.random.default_rng([seed, epoch]).permutation(len(demos))
        out.extend(demos[i] for i in order[offset:offset + size - len(out)])
    return out


def sft_lr_at(ws: WarmStartConfig, step: int) -> float | None:
    """The policy's lr at SFT step `step` (0-based; pure): `sft_lr`, or with `sft_lr_final` a cosine from
    `sft_lr` down to it at `sft_steps` (the cap: SFT that ends at its plateau ends before the lowest rate)."""
    if ws.sft_lr is None or ws.sft_lr_final is None:
        return ws.sft_lr
    frac = min(1.0, step / max(1, ws.sft_steps))
    return ws.sft_lr_final + (ws.sft_lr - ws.sft_lr_final) * 0.5 * (1.0 + math.cos(math.pi * frac))


def published_weights(publisher: Publisher, sft_step: int, tc: TrainerConfig) -> dict[str, torch.Tensor] | None:
    """Rank 0: the state dict published after SFT step `sft_step` (SFT is the first stage: its steps are the
    trainer's steps); other ranks get None and receive rank 0's tensors."""
    if ds.rank() != 0:
        return None
    found = [v for v in publisher.published() if v.step == sft_step]
    if not found:
        have = ", ".join(f"v{v.version} (step {v.step})" for v in publisher.published()) or "none"
        raise ValueError(f"the weights of SFT step {sft_step} are no longer published (have: {have}); "
                         f"trainer.keep_versions ({tc.keep_versions}) must exceed "
                         f"warm_start.sft_patience ({tc.warm_start.sft_patience})")
    # through transformers: the folder's layout is the saved one (experts one by one), not the module's
    return dict(load_policy(found[-1].path).state_dict())


def anchor_reference(reference: torch.nn.Module | None, policy: Any, work_dir: Path, version: int) -> None:
    """With rl.kl_coef (a reference model): the KL reference becomes the warm-started policy, so PPO is held near
    what SFT made, not near the model SFT began with; saved as work_dir/reference, which a restart loads."""
    if reference is None:
        return
    if policy.zero_optimization_stage() == 3:
        log.warning("ZeRO-3: the KL reference stays the model SFT began with (not the warm-started policy)")
        return
    reference.load_state_dict(policy.module.state_dict())
    if ds.rank() == 0:
        final, tmp = work_dir / REFERENCE_DIR, work_dir / f".tmp-{REFERENCE_DIR}"
        shutil.rmtree(tmp, ignore_errors=True)
        cast(Any, reference).save_pretrained(str(tmp), safe_serialization=True)  # a Hugging Face model
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    log.info("KL reference set to the warm-started policy (version %d)", version)
