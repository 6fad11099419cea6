"""DeepSpeed plumbing: the process group, engines built from the config's DeepSpeed section, and
full-weight gathering for publishing.

Single-process runs (tests, the local stack) set the torch.distributed environment themselves
(rank 0 of 1 on 127.0.0.1, gloo on CPU); torchrun or the deepspeed launcher set it for
multi-process runs. The trainer owns its gradient accumulation: a step feeds a variable number of
token-budget micro-batches, so engines run with managed_gradient_accumulation false and one
engine.step() per optimizer step.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from t1.model.forward import enable_activation_checkpointing
from t1.routing.adapters import find_routers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed() -> None:
    """Join (or, alone, create) the process group; idempotent."""
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def shutdown_distributed() -> None:
    """Leave the process group. Ranks first meet at a barrier, so none closes its connections while a
    peer is still at work (gloo can abort a rank whose peer's connections close under it: pytorch/gloo#155)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def broadcast_object(obj: Any) -> Any:
    """Rank 0's value on every rank (identity when alone)."""
    if world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def zero_stage(ds_config: dict[str, Any]) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def engine_config(
    ds_config: dict[str, Any], lr: float | None = None, sequence_parallel_size: int = 1
) -> dict[str, Any]:
    """The DeepSpeed config an engine gets: the user's section, trainer-owned accumulation, lr, SP size."""
    cfg = copy.deepcopy(ds_config)
    if sequence_parallel_size > 1:
        cfg["sequence_parallel_size"] = sequence_parallel_size
    cfg["managed_gradient_accumulation"] = False
    cfg.pop("train_batch_size", None)
    cfg.setdefault("train_micro_batch_size_per_gpu", 1)
    cfg.setdefault("gradient_accumulation_steps", 1)
    cfg.setdefault("steps_per_print", 10**9)
    if lr is not None:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {}}).setdefault("params", {})["lr"] = lr
    return cfg


def moe_block_classes(model: nn.Module) -> list[type]:
    """Classes of the modules that own an MoE router (Qwen3MoeSparseMoeBlock, ...): ZeRO-3 leaves."""
    router_modules = {id(r.module) for r in find_routers(model)}
    classes: dict[str, type] = {}
    for module in model.modules():
        if any(id(child) in router_modules for child in module.children()):
            classes[type(module).__name__] = type(module)
    return list(classes.values())


def build_engine(model: nn.Module, ds_config: dict[str, Any], lr: float | None = None,
                 activation_checkpointing: bool = False, mpu: Any = None, sequence_parallel_size: int = 1) -> Any:
    """A DeepSpeedEngine over `model`, optimizer from the config; `mpu`: the SP groups
    (t1.trainer.sequence_parallel)."""
    import deepspeed

    cfg = engine_config(ds_config, lr, sequence_parallel_size)
    inner: Any = getattr(model, "backbone", model)  # the critic wraps a transformers backbone
    if activation_checkpointing:
        enable_activation_checkpointing(inner)
    if zero_stage(cfg) == 3:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(inner, moe_block_classes(inner))
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg, mpu=mpu)
    return engine


@contextlib.contextmanager
def learning_rate(engine: Any, lr: float | None) -> Iterator[None]:
    """The engine's optimizer steps at `lr` inside the block (None: unchanged), its own lr again after."""
    if lr is None:
        yield
        return
    groups = engine.optimizer.param_groups
    saved = [g["lr"] for g in groups]
    for g in groups:
        g["lr"] = lr
    try:
        yield
    finally:
        for g, old in zip(groups, saved, strict=True):
            g["lr"] = old


def copy_backbone(src: Any, dst: Any) -> bool:
    """Load the policy engine `src`'s transformer backbone into the critic engine `dst` (same shapes), and
    refresh dst's optimizer master copy so its next step starts from them. False, with nothing changed,
    under ZeRO-3 (partitioned parameters: not supported here)."""
    if src.zero_optimization_stage() == 3 or dst.zero_optimization_stage() == 3:
        return False
    source = src.module.base_model.state_dict()
    target = dst.module.backbone
    missing, unexpected = target.load_state_dict(source, strict=False)
    if missing or unexpected:
        raise ValueError(f"critic backbone does not match the policy's: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}")
    _refresh_master(dst)
    return True


def _refresh_master(engine: Any) -> None:
    """After the module's parameters were written: the ZeRO optimizer's fp32 master copy takes them, so the next
    step starts from them."""
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if refresh is not None:
        refresh()


def load_module_weights(engine: Any, state_dict: dict[str, torch.Tensor] | None) -> None:
    """Set the engine's parameters to rank 0's `state_dict` (every name, same shapes; other ranks pass None and
    receive it) and refresh the optimizer's master copy, so the next step starts from them. ZeRO-3 is refused
    (partitioned parameters)."""
    if engine.zero_optimization_stage() == 3:
        raise ValueError("restoring published weights is not supported under ZeRO-3")
    own = engine.module.state_dict()
    if state_dict is not None:
        missing, unexpected = sorted(own.keys() - state_dict.keys()), sorted(state_dict.keys() - own.keys())
        if missing or unexpected:
            raise ValueError(f"weights do not match the policy: missing {missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for name, tensor in own.items():
            if state_dict is not None:
                tensor.copy_(state_dict[name].to(tensor.device, tensor.dtype))
            if world_size() > 1:
                torch.distributed.broadcast(tensor, src=0)
    _refresh_master(engine)


def reset_optimizer_state(engine: Any) -> None:
    """Forget the engine's optimizer moments (its next step starts them anew, as a fresh optimizer would)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # the torch optimizer inside ZeRO's wrapper
    inner.state.clear()


def full_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """Every parameter and buffer, gathered (a collective under ZeRO-3); None on ranks other than 0."""
    if engine.zero_optimization_stage() == 3:
        sd = engine._zero3_consolidated_16bit_state_dict()
    else:
        sd = engine.module.state_dict()
    if rank() != 0:
        return None
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}
