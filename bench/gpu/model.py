"""The kit's model: a random-init Qwen3-MoE of the given depth and width (t1 model init's tokenizer).

    python bench/gpu/model.py --out DIR --layers 24 --experts 64 --top-k 8 --hidden 512

Prints one JSON line with the shape and the parameter count (total and active per token).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def parameter_counts(cfg: object) -> dict[str, int]:
    """Total parameters and those a token uses (top-k of the experts), from a Qwen3-MoE config."""
    def g(name: str) -> int:
        return int(getattr(cfg, name))

    h, layers, e, k = g("hidden_size"), g("num_hidden_layers"), g("num_experts"), g("num_experts_per_tok")
    q, kv = g("num_attention_heads") * g("head_dim"), g("num_key_value_heads") * g("head_dim")
    attention = h * q * 2 + h * kv * 2
    expert = 3 * h * g("moe_intermediate_size")
    embeddings = g("vocab_size") * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return {"parameters": layers * (attention + e * expert + h * e) + embeddings,
            "active_parameters": layers * (attention + k * expert + h * e) + embeddings}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--top-k", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from transformers import AutoConfig

    from bench.fidelity.measure import resize_model
    from t1.model.init import init_model

    init_model(args.out, "tiny", seed=args.seed)
    resize_model(args.out, seed=args.seed, layers=args.layers, experts=args.experts, top_k=args.top_k,
                 hidden=args.hidden)
    cfg = AutoConfig.from_pretrained(str(args.out))
    print(json.dumps({"model": str(args.out), "layers": args.layers, "experts": args.experts, "top_k": args.top_k,
                      "hidden": args.hidden, **parameter_counts(cfg)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
