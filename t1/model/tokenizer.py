"""Train a byte-level BPE tokenizer locally (the `tokenizers` library) and give it a Qwen3-style chat template.

Two pre-tokenizer splits (a preset's `tokenizer_split`). `qwen2` is Qwen2/Qwen3's: the split regex below,
then byte-level without a regex of its own. Every digit is a token of its own and never carries a
leading space, so a number is the same tokens wherever it stands (` 59` after `echo` and a line-initial
`59` in a command's output alike): copying a value the machine showed is copying tokens. `gpt2` is
GPT-2's byte-level regex, which merges ` 59` and `59` into different tokens; a model of the learn
preset's size did not learn to map 90 numbers between them. The template is ChatML with tool calls:
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` in the assistant turn and
`<tool_response>...</tool_response>` in a user turn, as Qwen3 writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from t1.model.chat_template import CHAT_TEMPLATE

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (
    END_OF_TEXT, IM_START, IM_END, "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
# Qwen2/Qwen3's pre-tokenizer split (their tokenizer.json): contractions, words with one leading
# non-letter, single digits, punctuation runs, newlines, spaces.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TokenizerSplit = Literal["gpt2", "qwen2"]


def recipe(split: TokenizerSplit) -> str:
    """The tokenizer recipe t1_model.json records: a model folder made with another one is remade."""
    return f"bpe-{split}-split"


def train_bpe(corpus: Iterable[str], vocab_size: int, split: TokenizerSplit = "gpt2") -> Tokenizer:
    """A byte-level BPE with SPECIAL_TOKENS at ids 0..8; single-threaded so merges are reproducible."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer(models.BPE())
    if split == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int, chat_template: str = CHAT_TEMPLATE,
                   special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) the way transformers reads them."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=END_OF_TEXT, unk_token=None, bos_token=None,
        additional_special_tokens=[t for t in special_tokens if t not in (IM_END, END_OF_TEXT)],
        model_max_length=model_max_length, clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    # Keep the folder readable by transformers 4.x too (vLLM pins one): a class name both know, the
    # template inside tokenizer_config.json, and the extra special tokens under their 4.x key.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    extra = cfg.pop("extra_special_tokens", None) or cfg.pop("additional_special_tokens", None) or []
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", additional_special_tokens=list(extra),
               chat_template=chat_template)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
