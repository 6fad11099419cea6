"""t1/model/forward.py: the KV cache and activation checkpointing reach the model under the names its
transformers release reads (a cache under a name the model does not know is silently ignored)."""

from __future__ import annotations

import pytest
import torch
from routing_models import tiny_qwen3_moe
from transformers import DynamicCache

from t1.model.forward import cache_keyword, cache_kwargs, enable_activation_checkpointing


class _OldRelease:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return past_key_values


class _NewRelease:
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return cache


class _NoCache:
    def forward(self, input_ids=None, **kwargs):
        return None


def test_the_keyword_follows_the_release():
    assert cache_keyword(_OldRelease) == "past_key_values"
    assert cache_keyword(_NewRelease) == "cache"
    with pytest.raises(TypeError, match=r"_NoCache\.forward takes neither"):
        cache_keyword(_NoCache)


def test_incremental_decode_through_cache_kwargs_equals_the_full_forward():
    """Fails when the cache is passed under a name the installed release ignores: each step then
    attends to itself alone."""
    model = tiny_qwen3_moe(seed=3)
    ids = torch.randint(0, 128, (1, 14), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = model(input_ids=ids).logits.log_softmax(-1)
        kv = DynamicCache(config=model.config)
        steps = [model(input_ids=ids[:, :8], use_cache=True, **cache_kwargs(model, kv)).logits]
        for t in range(8, 14):
            steps.append(model(input_ids=ids[:, t:t + 1], use_cache=True, **cache_kwargs(model, kv)).logits)
        incremental = torch.cat(steps, dim=1).log_softmax(-1)
    assert kv.get_seq_length() == 14
    assert (full - incremental).abs().max().item() < 1e-4


def test_activation_checkpointing_turns_on():
    model = tiny_qwen3_moe(seed=5).train()
    assert not model.is_gradient_checkpointing
    enable_activation_checkpointing(model, use_reentrant=False)
    assert model.is_gradient_checkpointing
