"""Token ids <-> text for TITO through the `tokenizers` backend directly, without the transformers wrapper.

For a transformers fast tokenizer (TokenizersBackend) whose encode/decode path is the library's own,
`tok.encode(text, add_special_tokens=False)` is: reset the backend's truncation and padding, set its
`encode_special_tokens` to `tok.split_special_tokens`, then `encode_batch([text])` and keep the ids;
`tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` is the backend's
`decode`. DirectCodec does exactly that (same backend object, same state changes), minus the
per-call argument handling and list conversions (to_py_obj walks every id). Offsets are not
tracked (encode_batch_fast): they never change the ids. A tokenizer that overrides any step, or
whose direct ids differ from the wrapper's on a probe text, gets no DirectCodec (direct_codec -> None).
When the backend's decoder is byte-level alone, decode joins each id's bytes from a table built
once instead (`byte_level_table`), kept only if it decodes every probe as the backend does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

# Text that exercises added/special tokens next to ordinary text, whitespace runs and non-ASCII.
_PROBE_TEXTS = ("", "a", "  two  spaces\n\n\ttab\r\n", "Ünïcödé — 日本語 ✓ 🙂", "x{\"k\": [1, 2]}\\n")


class DirectCodec:
    """encode/decode on a transformers fast tokenizer's backend, with the wrapper's backend state."""

    def __init__(self, tokenizer: Any, fast_decode: bool = True, table: dict[int, bytes] | None = None) -> None:
        self._tok = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._bytes = table if table is not None else byte_level_table(self._backend) if fast_decode else None

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
        if self._bytes is not None:
            try:
                return b"".join(map(self._bytes.__getitem__, ids)).decode("utf-8", "replace")
            except KeyError:  # an id the vocabulary lacks: the backend says what becomes of it
                pass
        return self._backend.decode(ids, skip_special_tokens=False)


def _byte_level_chars() -> dict[str, int]:
    """The byte-level alphabet: the printable character that stands for each byte (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in chars.values())
    chars.update((chr(256 + i), b) for i, b in enumerate(shifted))
    return chars


def byte_level_table(backend: Any) -> dict[int, bytes] | None:
    """Each id's bytes when the backend's decoder is byte-level alone, else None.

    Such a decoder maps every character of every token (added tokens too) to its byte, keeps the
    UTF-8 of a token that has a character outside the alphabet, joins all bytes and decodes them
    with U+FFFD for each maximal invalid subsequence, as Python's "replace" does. So
    decode(ids) == b"".join(table[i] for i in ids).decode("utf-8", "replace"), about five times
    faster than the backend, which clones a string per token; direct_codec checks it on probes.
    """
    try:
        from tokenizers import decoders
        from tokenizers.pre_tokenizers import ByteLevel
    except ImportError:
        return None
    if type(backend.decoder) is not decoders.ByteLevel:
        return None
    chars = _byte_level_chars()
    if set(ByteLevel.alphabet()) != set(chars):
        return None
    table = {}
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        try:
            table[i] = bytes([chars[c] for c in token])
        except KeyError:
            table[i] = token.encode("utf-8")
    return table


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
    backend = tokenizer.backend_tokenizer
    key = (id(backend), backend.get_vocab_size(with_added_tokens=True), end_of_turn)
    cached = _VERIFIED_TABLES.get(key)
    codec = DirectCodec(tokenizer, table=cached[1] if cached is not None else None)
    special = "".join(str(t) for t in tokenizer.all_special_tokens)
    for text in (*_PROBE_TEXTS, end_of_turn, special, f"a{end_of_turn}\n{special} b"):
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if codec.encode(text) != ids:
            return None
        wrapped = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if codec.decode(ids) != wrapped:
            return None
    if cached is None and codec._bytes is not None:
        if _table_decodes_like_backend(codec, end_of_turn):
            _VERIFIED_TABLES[key] = (backend, codec._bytes)
            while len(_VERIFIED_TABLES) > _MAX_TABLES:
                del _VERIFIED_TABLES[next(iter(_VERIFIED_TABLES))]
        else:
            codec._bytes = None
    return codec


# Byte tables checked against their backend, by (backend identity, its size, end of turn): renderers of
# one tokenizer (one per agent format, per template setting) share one; building and checking a table
# costs seconds on a 151k vocabulary. The entry holds the backend, so its id is not reused meanwhile.
_VERIFIED_TABLES: dict[tuple[int, int, str], tuple[Any, dict[int, bytes]]] = {}
_MAX_TABLES = 4


def _table_decodes_like_backend(codec: DirectCodec, end_of_turn: str) -> bool:
    """The byte table's decode equals the backend's on every id, on prefixes of texts that end
    inside a multi-byte character, and on seeded random id sequences with added tokens."""
    backend, table = codec._backend, codec._bytes
    assert table is not None
    added = sorted(backend.get_added_tokens_decoder())
    ordinary = [i for i in sorted(table) if i not in set(added)]
    probes: list[list[int]] = [[i] for i in added]
    probes += [ordinary[k:k + 64] for k in range(0, len(ordinary), 64)]  # every id once
    for text in (*_PROBE_TEXTS, f"é{end_of_turn}ü", "ünï 日本 🙂x"):
        ids = backend.encode(text, add_special_tokens=False).ids
        probes += [ids[:k] + ids[j:] for k in range(len(ids) + 1) for j in (k, len(ids)) if j >= k]
    rng = random.Random(0)
    for n in (1, 2, 3, 8, 64):
        for _ in range(40):
            probes.append([rng.choice(ordinary) if rng.random() > 0.1 or not added else rng.choice(added)
                           for _ in range(n)])
    return all(codec.decode(ids) == backend.decode(ids, skip_special_tokens=False) for ids in probes)
