"""How a Hugging Face causal LM takes its KV cache: the keyword differs between transformers releases.

Releases up to 5.2x name it `past_key_values`; later ones name it `cache` and map the old name onto it
with a deprecation warning. A keyword the model does not know falls into its `**kwargs` and is
silently ignored, so a call with the wrong name runs every step without its history: the sampler then
generates from the wrong distribution and no error says so. Callers pass the cache through
`cache_kwargs`, which names it as the loaded model's forward does.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any


@cache
def cache_keyword(model_cls: Any) -> str:
    """The keyword of `model_cls.forward` that takes the KV cache."""
    params = inspect.signature(model_cls.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{model_cls.__name__}.forward takes neither `cache` nor `past_key_values`: "
                    "cannot pass it a KV cache")


def cache_kwargs(model: Any, kv_cache: Any) -> dict[str, Any]:
    """`{keyword: kv_cache}` for `model(...)`, in the name its transformers release reads."""
    model_cls: Any = type(model)
    return {cache_keyword(model_cls): kv_cache}


def enable_activation_checkpointing(model: Any, *, use_reentrant: bool | None = None) -> None:
    """Turn on activation checkpointing, by the method name the model's transformers release has.

    Later releases call it `activation_checkpointing_enable(activation_checkpointing_kwargs=...)`,
    earlier ones `gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)`.
    """
    kwargs = None if use_reentrant is None else {"use_reentrant": use_reentrant}
    new = getattr(model, "activation_checkpointing_enable", None)
    if new is not None:
        new(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
