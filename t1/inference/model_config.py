"""What a Hugging Face model folder says about itself (config.json, generation_config.json), read without torch."""

from __future__ import annotations

import json
from pathlib import Path

from t1.inference.routing_capture import MoeShape


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def moe_shape_from_config(cfg: dict) -> MoeShape | None:
    """MoE layers, experts and top-k from a Qwen3-MoE / Qwen2-MoE / Mixtral / OLMoE style config.json."""
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    top_k = cfg.get("num_experts_per_tok") or 0
    if not num_experts or not top_k:
        return None
    layers = int(cfg["num_hidden_layers"])
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    moe_layers = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    return MoeShape(num_layers=len(moe_layers), num_experts=int(num_experts), top_k=int(top_k))


def eos_ids(model_dir: Path, cfg: dict) -> tuple[int, ...]:
    eos = read_json(model_dir / "generation_config.json").get("eos_token_id", cfg.get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
