"""The policy's tokenizer as the token view needs it: id -> text, the end-of-turn ids, the special ids.

Read straight from the model folder's tokenizer.json and tokenizer_config.json with the `tokenizers`
library (no transformers, no torch): the viewer starts in a fraction of a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True, eq=False)
class Vocab:
    tokenizer: Tokenizer | None
    eot_ids: tuple[int, ...]
    special_ids: frozenset[int]
    _texts: dict[int, str] = field(default_factory=dict)

    def decode(self, token_id: int) -> str:
        """The text of one token; `#<id>` when no tokenizer was found."""
        if self.tokenizer is None:
            return f"#{token_id}"
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


NO_VOCAB = Vocab(None, (), frozenset())


def load_vocab(model_dir: Path | None) -> Vocab:
    """The vocab of a Hugging Face model folder; NO_VOCAB when there is no folder or no tokenizer.json."""
    if model_dir is None or not (model_dir / "tokenizer.json").is_file():
        return NO_VOCAB
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    eot_ids = tuple(tok.encode(eos, add_special_tokens=False).ids) if isinstance(eos, str) and eos else ()
    data = json.loads((model_dir / "tokenizer.json").read_text())
    specials = frozenset(int(t["id"]) for t in data.get("added_tokens", []) if t.get("special"))
    return Vocab(tok, eot_ids, specials)

