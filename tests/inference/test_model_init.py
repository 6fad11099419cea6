"""`t1 model init`: a loadable Qwen3-MoE folder, byte-identical for a seed, with a working chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1.cli.main import main as t1_main
from t1.model.tokenizer import SPECIAL_TOKENS

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def test_tiny_model_loads_and_is_moe(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["norm_topk_prob"] is True
    assert cfg["num_experts"] == 8 and cfg["num_experts_per_tok"] == 2 and cfg["mlp_only_layers"] == []
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert all(type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in model.model.layers)
    out = model(torch.tensor([[1, 5, 9]]))
    assert out.logits.shape == (1, 3, cfg["vocab_size"])


def test_tokenizer_specials_and_chat_template(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for special in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(special) is not None
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    assert tok.eos_token == "<|im_end|>"
    messages = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la /app"}}}]},
        {"role": "tool", "content": "total 0"},
    ]
    text = tok.apply_chat_template(messages, tools=[BASH_TOOL], tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_start|>user")[0]
    assert '{"type": "function", "function": {"name": "bash"' in system
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /app"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\ntotal 0\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_same_seed_gives_identical_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert t1_main(["model", "init", "--out", str(tmp_path / "again"), "--preset", "tiny", "--seed", "0"]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_other_seed_gives_other_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    from t1.model.init import init_model

    other = init_model(tmp_path / "seed1", "tiny", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny_model_dir / "model.safetensors").read_bytes()


def test_refuses_to_overwrite_a_non_model_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert t1_main(["model", "init", "--out", str(tmp_path), "--preset", "tiny"]) == 2
    assert "refusing" in capsys.readouterr().out and (tmp_path / "keep.txt").exists()


def test_a_number_is_the_same_tokens_wherever_it_stands() -> None:
    """The learn preset's split (Qwen3's): single digits without a leading space, so a value printed at the
    start of a line and typed after `echo ` are the same tokens; GPT-2's split (tiny, small) makes them differ."""
    from t1.model.corpus import curriculum_corpus
    from t1.model.presets import get_preset
    from t1.model.tokenizer import train_bpe

    assert get_preset("learn").tokenizer_split == "qwen2"
    corpus = list(curriculum_corpus(0))
    for split in ("qwen2", "gpt2"):
        tok = train_bpe(corpus, 1024, split)
        for number in ("7", "59", "2048"):
            printed = tok.encode(f"{number}\n").tokens[:-1]
            typed = tok.encode(f"echo {number} > red.txt").tokens
            same = printed == list(number) and typed[1:2 + len(number)] == ["\u0120", *number]
            assert same == (split == "qwen2"), (split, printed, typed)


def test_learn_long_is_learn_with_the_long_tier_and_the_compaction_texts_in_its_corpus() -> None:
    """learn-long: the learn preset's shapes; its corpus is learn's unchanged (so local.yaml's model stays the
    same), then the long tier's commands and files, the compaction request and notes."""
    from dataclasses import replace

    from t1.agent.compaction import NOTE_HEAD, SUMMARY_REQUEST
    from t1.model.corpus import curriculum_corpus
    from t1.model.presets import get_preset

    assert get_preset("learn-long") == replace(get_preset("learn"), corpus="curriculum-long")
    learn, long = list(curriculum_corpus(0)), list(curriculum_corpus(0, long_tier=True))
    assert long[:len(learn)] == learn and len(long) > len(learn)
    extra = "".join(long[len(learn):])
    assert all(text in extra for text in (SUMMARY_REQUEST, NOTE_HEAD, "bash next.sh", "bash svc.sh init", "next: "))


def test_a_file_chain_path_is_one_name_token_to_the_learn_long_tokenizer() -> None:
    """file_chain's paths (`chain/owl.txt`) tokenize as the folder, one `/name` token and `.txt`, the same in
    the file that names the next and in the command that opens it: the hop copies one token. (A folder drawn
    per task, `store/beta.txt`, put a second token to copy, and the learn model typed it at chance.)"""
    from t1.model.corpus import curriculum_corpus
    from t1.model.presets import get_preset
    from t1.model.tokenizer import train_bpe
    from t1.tasks.synth.long_tier import CHAIN_DIR, CHAIN_NAMES

    spec = get_preset("learn-long")
    tok = train_bpe(curriculum_corpus(0, long_tier=True), spec.tokenizer_vocab, spec.tokenizer_split)
    for name in CHAIN_NAMES:
        shown = tok.encode(f"next: {CHAIN_DIR}/{name}.txt").tokens
        typed = tok.encode(f'{{"command": "cat {CHAIN_DIR}/{name}.txt"}}').tokens
        path = ["\u0120" + CHAIN_DIR, f"/{name}", ".txt"]
        at = typed.index(path[0])
        assert shown[-3:] == path and typed[at:at + 3] == path, (name, shown, typed)


def test_a_folder_made_by_another_recipe_is_remade_a_trained_one_kept(tmp_path: Path) -> None:
    from t1.model.init import init_model, why_make

    path = init_model(tmp_path / "m", "tiny", seed=0)
    assert why_make(path, "tiny", 0) is None
    assert why_make(tmp_path / "none", "tiny", 0) == "it holds no model"
    made = json.loads((path / "t1_model.json").read_text())
    (path / "t1_model.json").write_text(json.dumps({**made, "tokenizer": "bpe-qwen2-split"}))
    assert why_make(path, "tiny", 0) == "it was made with tokenizer 'bpe-qwen2-split', not 'bpe-gpt2-split'"
    assert "seed 0, not 1" in (why_make(path, "tiny", 1) or "")
    assert why_make(path, None, 0) is None, "no preset configured: the folder is the model"
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # weights someone trained into the folder
    assert why_make(path, "tiny", 0) is None, "a folder whose weights changed since it was made is kept"
    (path / "t1_model.json").unlink()
    assert why_make(path, "tiny", 1) is None, "a folder T1 did not make is kept"
