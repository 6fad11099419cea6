"""The real Qwen2/2.5/3 tokenizer, built offline from the BPE ranks the `dashscope` package ships.

`dashscope/resources/qwen.tiktoken` holds Qwen's byte-level BPE ranks (151,643 tokens, ids 0..151642),
the vocabulary Qwen2, Qwen2.5 and Qwen3 share. With Qwen's pre-tokenizer (NFC, the split regex of
t1/model/tokenizer.py, byte-level), merges derived from the ranks (transformers' TikTokenConverter)
and Qwen3's 26 added tokens at ids 151643..151668, it is the tokenizer of Qwen3's tokenizer.json.
tests/model/test_qwen_tokenizer.py checks it against token ids published in public test files and
against tiktoken on the same ranks. Nothing is downloaded: the file comes with the package.

    tok = qwen3_tokenizer(chat_template)       # a transformers fast tokenizer, eos <|im_end|>
"""

from __future__ import annotations

import functools
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers

from t1.model.tokenizer import SPLIT_PATTERN

NUM_RANKS = 151_643     # ordinary tokens, ids 0..151642
QWEN3_VOCAB = 151_936   # Qwen3's embedding rows (the added tokens, then padding rows)
# Qwen3's added tokens in id order from 151643; the tool-call and think tags are not "special" (a
# decode that skips special tokens keeps them), as in Qwen3's tokenizer.json.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)


def qwen_ranks_path() -> Path:
    """Where the installed `dashscope` package keeps qwen.tiktoken (the package is not imported)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen vocabulary comes with the `dashscope` package, which is not installed "
                                "(pip install dashscope)")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"the installed dashscope package has no {path}")
    return path


def build_qwen_tokenizer() -> Tokenizer:
    """Qwen3's `tokenizers` Tokenizer: ranks, merges, pre-tokenizer, decoder and added tokens (a fresh
    object each call; the merges are derived once per process, about ten seconds)."""
    return Tokenizer.from_str(_qwen_tokenizer_json())


@functools.cache
def _qwen_tokenizer_json() -> str:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(qwen_ranks_path()), pattern=SPLIT_PATTERN).tokenizer()
    if tok.get_vocab_size() != NUM_RANKS:
        raise ValueError(f"qwen.tiktoken holds {tok.get_vocab_size()} tokens, expected {NUM_RANKS}")
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    if tok.token_to_id("</think>") != NUM_RANKS + len(ADDED_TOKENS) - 1:
        raise ValueError("Qwen3's added tokens did not get ids 151643..151668")
    return str(tok.to_str())


def qwen3_tokenizer(chat_template: str | None = None, model_max_length: int = 40_960) -> Any:
    """A transformers fast tokenizer equal to Qwen3's (eos <|im_end|>, pad <|endoftext|>)."""
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:  # from a file: a tokenizer_object would be deep-copied (seconds)
        path = Path(tmp) / "tokenizer.json"
        path.write_text(_qwen_tokenizer_json())
        return PreTrainedTokenizerFast(
            tokenizer_file=str(path), eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
            bos_token=None, model_max_length=model_max_length, clean_up_tokenization_spaces=False,
            chat_template=chat_template, split_special_tokens=False)
