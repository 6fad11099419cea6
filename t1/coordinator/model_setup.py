"""The policy model on the coordinator's side: its folder (made from its preset when missing) and one chat
renderer per agent format from its tokenizer."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

from t1.agent.formats import FormatName, get_format
from t1.config.schema import T1Config
from t1.tito import ChatRenderer
from t1.tito.render import ChatTokenizer, turn_ends

log = logging.getLogger(__name__)


def make_renderers(model_path: Path, tool_schemas: bool = True,
                   template_kwargs: dict[str, Any] | None = None) -> dict[FormatName, ChatRenderer]:
    """One renderer per agent format (the tool-call format puts its tools into the template unless told not to);
    template_kwargs: variables for the chat template (inference.model.chat_template_kwargs). A template the
    renderer cannot render deltas with is refused here, when the model is loaded (ValueError)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    if not tok.eos_token:
        raise ValueError(f"inference.model.path: the tokenizer of {model_path} has no eos_token (end of turn)")
    chat = cast(ChatTokenizer, tok)
    eot, stops = turn_ends(chat, tok.eos_token, _stop_tokens(model_path, tok), template_kwargs)
    try:
        return {name: ChatRenderer(chat, end_of_turn=eot, tools=get_format(name).tools if tool_schemas else None,
                                   template_kwargs=template_kwargs, stop_texts=stops)
                for name in FormatName}
    except ValueError as exc:
        raise ValueError(f"inference.model.path: the chat template of {model_path}: {exc}") from None


def _stop_tokens(model_path: Path, tok: Any) -> list[str]:
    """The tokens the sampler stops on besides eos_token: generation_config.json's eos_token_id."""
    path = model_path / "generation_config.json"
    if not path.is_file():
        return []
    ids = json.loads(path.read_text()).get("eos_token_id")
    ids = [ids] if isinstance(ids, int) else ids if isinstance(ids, list) else []
    return [str(t) for t in tok.convert_ids_to_tokens([i for i in ids if isinstance(i, int)]) if t]


def ensure_model(cfg: T1Config) -> Path:
    """The policy model folder, made from its preset when missing or made by an older recipe (the local run)."""
    from t1.model.init import ensure_made

    model = cfg.inference.model
    try:
        why = ensure_made(model.path, model.init_preset, model.init_seed)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"inference.model.path: {exc}") from None
    if why is not None:
        log.info("made the %s model in %s: %s", model.init_preset, model.path, why)
    return model.path
