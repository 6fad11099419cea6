"""Create a random-init Qwen3-MoE model folder with a locally trained tokenizer, deterministic by seed.

The folder is a Hugging Face model folder: config.json, model.safetensors, generation_config.json,
tokenizer.json and tokenizer_config.json (with a chat template that supports a `bash` tool).
Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from t1.model.corpus import curriculum_corpus, shell_corpus
from t1.model.presets import ModelPreset, PresetName, get_preset
from t1.model.qwen_tokenizer import ADDED_TOKENS, QWEN3_VOCAB, build_qwen_tokenizer
from t1.model.tokenizer import END_OF_TEXT, IM_END, recipe, save_tokenizer, train_bpe


def preset_recipe(spec: ModelPreset) -> str:
    """The tokenizer recipe t1_model.json records for a preset."""
    return "qwen3-ranks" if spec.tokenizer == "qwen3" else recipe(spec.tokenizer_split)


def qwen3_chat_template() -> str:
    """Qwen3's own chat template (t1/model/templates, with its attribution)."""
    return (Path(__file__).parent / "templates" / "qwen3.jinja").read_text()


def init_model(out_dir: Path, preset: PresetName, seed: int, corpus: Iterable[str] | None = None) -> Path:
    """Write the model folder to out_dir (created, or replaced if it holds a model) and return it.

    corpus: text to train the tokenizer on; None uses the preset's: `shell_corpus(seed)` or
    `curriculum_corpus(seed)` (with its long tier for `learn-long`).
    The same preset, seed and corpus give byte-identical files.
    """
    import torch
    from transformers import GenerationConfig, Qwen3MoeForCausalLM

    spec = get_preset(preset)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "config.json").exists():
        raise FileExistsError(f"--out {out_dir} exists, is not empty and holds no model; refusing to overwrite")
    if spec.tokenizer == "qwen3":
        tok = build_qwen_tokenizer()
        vocab_size = QWEN3_VOCAB  # Qwen3's rows: the ranks, the added tokens, padding rows
    else:
        if corpus is None:
            corpus = shell_corpus(seed) if spec.corpus == "shell" else \
                curriculum_corpus(seed, long_tier=spec.corpus == "curriculum-long")
        tok = train_bpe(corpus, spec.tokenizer_vocab, spec.tokenizer_split)
        vocab_size = tok.get_vocab_size()
    eos_id, pad_id = tok.token_to_id(IM_END), tok.token_to_id(END_OF_TEXT)
    config = model_config(spec, vocab_size, eos_id, pad_id)
    torch.manual_seed(seed)
    model: Any = Qwen3MoeForCausalLM(config)
    model = model.to(torch.float32).eval()
    _sharpen(model, spec.hidden_size, seed)
    gen = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=True,
                           temperature=1.0, top_p=1.0, top_k=0)
    tmp = Path(tempfile.mkdtemp(prefix=".init-", dir=out_dir.parent if out_dir.parent.exists() else None))
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" would reach the run's terminal
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        _add_config_aliases(tmp / "config.json", spec.num_experts)
        gen.save_pretrained(str(tmp))
        if spec.tokenizer == "qwen3":
            save_tokenizer(tok, tmp, spec.max_position_embeddings, chat_template=qwen3_chat_template(),
                           special_tokens=tuple(t for t, special in ADDED_TOKENS if special))
        else:
            save_tokenizer(tok, tmp, spec.max_position_embeddings)
        (tmp / "t1_model.json").write_text(json.dumps(
            {"preset": preset, "seed": seed, "tokenizer": preset_recipe(spec),
             "weights_sha256": _sha256(tmp / "model.safetensors")}, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir


def why_make(out_dir: Path, preset: str | None, seed: int) -> str | None:
    """Why `init_model(out_dir, preset, seed)` should run now, or None to use the folder as it is.

    A folder without a model needs one. A folder T1 made (t1_model.json) from another preset or seed, or
    with another tokenizer recipe, is remade, unless its weights are no longer the ones it was made with
    (someone trained or replaced them): that folder is kept as it is. A folder T1 did not make is kept.
    """
    out_dir = Path(out_dir)
    if not (out_dir / "config.json").is_file():
        return "it holds no model"
    try:
        made = json.loads((out_dir / "t1_model.json").read_text())
    except (OSError, ValueError):
        return None
    if preset is None or not isinstance(made, dict):
        return None
    try:
        spec = get_preset(preset)
    except ValueError:
        return None  # the config validates the preset's name; nothing to compare here
    wanted = {"preset": preset, "seed": seed, "tokenizer": preset_recipe(spec)}
    differ = {k: v for k, v in wanted.items() if made.get(k) != v}
    if not differ or not (out_dir / "model.safetensors").is_file():
        return None
    if made.get("weights_sha256") != _sha256(out_dir / "model.safetensors"):
        return None
    return "it was made with " + ", ".join(f"{k} {made.get(k)!r}, not {v!r}" for k, v in differ.items())


def ensure_made(out_dir: Path, preset: PresetName | None, seed: int) -> str | None:
    """Make the model folder if `why_make` says so; the reason when it was made, None when kept as it is.

    FileNotFoundError when a model is needed and there is no preset to make it from.
    """
    why = why_make(out_dir, preset, seed)
    if why is None:
        return None
    if preset is None:
        raise FileNotFoundError(f"{out_dir} holds no model (config.json) and init_preset is null")
    init_model(out_dir, preset, seed)
    return why


def model_config(spec: ModelPreset, vocab_size: int, eos_id: int | None = None, pad_id: int | None = None) -> Any:
    """The Qwen3MoeConfig of a preset's shapes with the given vocabulary (every layer sparse MoE)."""
    from transformers import Qwen3MoeConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.moe_intermediate_size * 2,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim, num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok, moe_intermediate_size=spec.moe_intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False, eos_token_id=eos_id, pad_token_id=pad_id,
        bos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        dtype="float32",
    )
    return Qwen3MoeConfig(**kwargs)


def _sharpen(model, hidden_size: int, seed: int) -> None:
    """Give routers and the LM head logits of std ~2 (the default 0.02 init gives near-uniform ones).

    Near-tied router scores would let float rounding flip expert choices between an incremental and a
    full-sequence forward; a trained model's routers are that peaked too.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    std = 2.0 / hidden_size**0.5
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") or name == "lm_head.weight":
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def _add_config_aliases(path: Path, num_experts: int) -> None:
    """transformers 5 writes num_local_experts and rope_parameters; 4.x (which vLLM may pin) reads
    num_experts and rope_theta."""
    cfg = json.loads(path.read_text())
    cfg["num_experts"] = num_experts
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
