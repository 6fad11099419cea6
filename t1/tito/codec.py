"""Token ids <-> text for TITO through the `tokenizers` backend directly, without the transformers wrapper.

For a transformers fast tokenizer (TokenizersBackend) whose encode/decode path is the library's own,
`tok.encode(text, add_special_tokens=False)` is: reset the backend's truncation and padding, set its
`encode_special_tokens` to `tok.split_special_tokens`, then `encode_batch([text])` and keep the ids;
`tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` is the backend's
`decode`. DirectCodec does exactly that (same backend object, same state changes), minus the
per-call argument handling and list conversions (to_py_obj walks every id). Offsets are not
tracked (encode_batch_fast): they never change the ids. A tokenizer that overrides any step, or
whose direct ids differ from the wrapper's on a probe text, gets no DirectCodec (direct_codec -> None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Text that exercises added/special tokens next to ordinary text, whitespace runs and non-ASCII.
_PROBE_TEXTS = ("", "a", "  two  spaces\n\n\ttab\r\n", "Ünïcödé — 日本語 ✓ 🙂", "x{\"k\": [1, 2]}\\n")


class DirectCodec:
    """encode/decode on a transformers fast tokenizer's backend, with the wrapper's backend state."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._backend = tokenizer.backend_tokenizer

    def encode(self, text: str) -> list[int]:
        be = self._backend
        # What TokenizersBackend._encode_plus does before each encode without truncation or padding.
        if be.truncation is not None:
            be.no_truncation()
        if be.padding is not None:
            be.no_padding()
        split = self._tok.split_special_tokens
        if be.encode_special_tokens != split:
            be.encode_special_tokens = split
        return be.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        if type(ids) is not list:
            ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # numpy arrays: python ints, as to_py_obj
        return self._backend.decode(ids, skip_special_tokens=False)


def direct_codec(tokenizer: Any, end_of_turn: str) -> DirectCodec | None:
    """A DirectCodec when the tokenizer's encode/decode are transformers' fast path, unmodified, and
    agree with it on probe texts (special tokens included); None otherwise."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    cls = type(tokenizer)
    own = (cls.encode is PreTrainedTokenizerBase.encode and cls.decode is PreTrainedTokenizerBase.decode
           and cls._get_padding_truncation_strategies is PreTrainedTokenizerBase._get_padding_truncation_strategies
           and cls._encode_plus is TokenizersBackend._encode_plus and cls._decode is TokenizersBackend._decode)
    if not (own and hasattr(tokenizer.backend_tokenizer, "encode_batch_fast")):
        return None
    codec = DirectCodec(tokenizer)
    special = "".join(str(t) for t in tokenizer.all_special_tokens)
    for text in (*_PROBE_TEXTS, end_of_turn, special, f"a{end_of_turn}\n{special} b"):
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if codec.encode(text) != ids:
            return None
        wrapped = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if codec.decode(ids) != wrapped:
            return None
    return codec
