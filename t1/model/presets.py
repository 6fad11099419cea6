"""Model presets for `t1 model init`: the Qwen3-MoE shapes of the tiny and small random-init models."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

PresetName = Literal["tiny", "small", "learn", "learn-long", "qwen3-vocab"]


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """Sizes of one random-init Qwen3-MoE; every decoder layer is a sparse MoE layer."""

    tokenizer_vocab: int          # BPE vocabulary target, special tokens included
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    max_position_embeddings: int
    # the tokenizer's text: shell sessions (+ the curriculum's; + its long tier's and the compaction texts)
    corpus: Literal["shell", "curriculum", "curriculum-long"] = "shell"
    # the pre-tokenizer split (t1/model/tokenizer.py): qwen2 keeps numbers as digit tokens, for copying values
    tokenizer_split: Literal["gpt2", "qwen2"] = "gpt2"
    # "trained": a BPE trained here on the corpus with T1's chat template; "qwen3": the real Qwen3
    # tokenizer (t1/model/qwen_tokenizer.py, 151,936 embedding rows) with Qwen3's own chat template
    tokenizer: Literal["trained", "qwen3"] = "trained"


PRESETS: dict[str, ModelPreset] = {
    # Fast on one CPU core: a forward over a few hundred tokens takes milliseconds. head_dim 32 is
    # the smallest vLLM's CPU attention supports.
    "tiny": ModelPreset(
        tokenizer_vocab=1024,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        max_position_embeddings=8192,
    ),
    # Sized for the CPU learning run (examples/local.yaml): about 1.0M parameters (vocabulary 1,129), a tokenizer
    # that also knows the tool-call prompt and the curriculum's words, so an episode of it is a few hundred tokens.
    "learn": ModelPreset(
        tokenizer_vocab=2048,
        hidden_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=96,
        max_position_embeddings=4096,
        corpus="curriculum",
        tokenizer_split="qwen2",
    ),
    # The real Qwen3 vocabulary and chat template on a tiny MoE: what a run on a Qwen3 model meets in tokens
    # and template (151,936 embedding rows; hidden kept small, so the two embedding matrices are 19M of its
    # parameters and a 1k-token forward's logits about 0.6 GB in float32).
    "qwen3-vocab": ModelPreset(
        tokenizer_vocab=151_936,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        max_position_embeddings=8192,
        tokenizer_split="qwen2",
        tokenizer="qwen3",
    ),
    # Still CPU-feasible, closer to a real model's proportions (about 20M parameters).
    "small": ModelPreset(
        tokenizer_vocab=4096,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        max_position_embeddings=16384,
    ),
}

# The learn preset's shapes with a tokenizer that also knows the long tier (examples/long.yaml): its commands, what
# its files show, the compaction request and notes, so a summary costs a few dozen tokens, not a few hundred.
PRESETS["learn-long"] = replace(PRESETS["learn"], corpus="curriculum-long")


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}") from None
