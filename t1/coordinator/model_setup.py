"""The policy model on the coordinator's side: its folder (made from its preset when missing) and one chat
renderer per agent format from its tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

from t1.agent.formats import FormatName, get_format
from t1.config.schema import T1Config
from t1.tito import ChatRenderer
from t1.tito.render import ChatTokenizer

log = logging.getLogger(__name__)


def make_renderers(model_path: Path, tool_schemas: bool = True) -> dict[FormatName, ChatRenderer]:
    """One renderer per agent format (the tool-call format puts its tools into the template unless told not to)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    eot = tok.eos_token
    if not eot:
        raise ValueError(f"inference.model.path: the tokenizer of {model_path} has no eos_token (end of turn)")
    chat = cast(ChatTokenizer, tok)
    return {name: ChatRenderer(chat, end_of_turn=eot, tools=get_format(name).tools if tool_schemas else None)
            for name in FormatName}


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
