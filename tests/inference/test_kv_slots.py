"""KV slots and row-batched sampling, in isolation: what the batched decode path is built on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from t1.inference.server.kv_slots import KvSlots
from t1.inference.server.sampling import make_generator, sample_rows, sample_token, sampling_logprobs
from t1.inference.server.slot_batch import SlotBatch
from t1.inference.types import SamplingParams
from t1.model.forward import cache_kwargs

ROW_PARAMS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=50, seed=2),
    SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=1.3, top_p=0.9, seed=4),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_k=50, seed=6),
]


def test_rows_sampled_together_equal_each_row_sampled_alone() -> None:
    logits_BV = torch.randn(len(ROW_PARAMS), 300, generator=torch.Generator().manual_seed(0)) * 3
    for _ in range(5):  # several draws: the generators advance the same way in both paths
        gens_a = [make_generator(p.seed) for p in ROW_PARAMS]
        gens_b = [make_generator(p.seed) for p in ROW_PARAMS]
        together = sample_rows(logits_BV, ROW_PARAMS, gens_a)
        alone = [sample_token(logits_BV[i], p, gens_b[i]) for i, p in enumerate(ROW_PARAMS)]
        assert [t for t, _ in together] == [t for t, _ in alone]
        assert [lp for _, lp in together] == pytest.approx([lp for _, lp in alone], abs=1e-6)
        logits_BV = logits_BV.roll(1, dims=-1)
    greedy = ROW_PARAMS.index(SamplingParams(temperature=0.0))
    assert together[greedy][0] == int(torch.argmax(logits_BV.roll(-1, dims=-1)[greedy]))


def _slots(model_dir: Path) -> tuple[object, KvSlots]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    slots = KvSlots.for_model(model)
    assert slots is not None
    return model, slots


def test_a_slot_cache_refuses_what_it_cannot_hold(tiny_model_dir: Path) -> None:
    _, slots = _slots(tiny_model_dir)
    cache = slots.new_cache()
    k = torch.zeros(2, slots.keys[0].shape[1], 3, slots.keys[0].shape[3])
    with pytest.raises(ValueError, match="key_states"):
        cache.update(k, k, 0)
    with pytest.raises(ValueError, match="tokens_to_remove"):
        cache.layers[0].crop(2)
    with pytest.raises(ValueError, match="positions"):
        slots.reserve(slots.max_positions + 1)


def test_a_model_with_sliding_window_layers_gets_no_slots(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    model.config.sliding_window = 8
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert KvSlots.for_model(model) is None


def test_a_decode_batch_writes_each_row_at_its_own_length(tiny_model_dir: Path) -> None:
    model, slots = _slots(tiny_model_dir)
    caches = [slots.new_cache() for _ in range(3)]
    with torch.inference_mode():
        for n, cache in zip((5, 9, 2), caches, strict=True):
            model(input_ids=torch.arange(16, 16 + n)[None], use_cache=True, **cache_kwargs(model, cache))
        before = [cache.layers[0].keys.clone() for cache in caches]
        batch = SlotBatch([caches[2], caches[0], caches[1]])  # the batch's rows come in slot order
        assert batch.order == [1, 2, 0]
        assert batch.attention_mask is not None
        assert batch.attention_mask.sum(-1).tolist() == [6, 10, 3]
        assert batch.position_ids[:, 0].tolist() == [5, 9, 2]
        model(input_ids=torch.tensor([[7], [7], [7]]), use_cache=True, **cache_kwargs(model, batch),
              attention_mask=batch.attention_mask, position_ids=batch.position_ids)
        batch.commit()
    for cache, old, n in zip(caches, before, (5, 9, 2), strict=True):
        assert cache.get_seq_length() == n + 1
        assert torch.equal(cache.layers[0].keys[:, :, :n], old), "a row's cached positions were overwritten"
        assert cache.layers[0].keys[:, :, n].abs().sum() > 0, "the new position was not written"
    with torch.inference_mode():  # the same new token fed alone gives the same key at that position
        alone = slots.new_cache()
        model(input_ids=torch.tensor([[16, 17, 7]]), use_cache=True, **cache_kwargs(model, alone))
    torch.testing.assert_close(alone.layers[0].keys[:, :, 2], caches[2].layers[0].keys[:, :, 2])


def test_packing_a_batch_onto_the_front_slots_keeps_every_row_intact(tiny_model_dir: Path) -> None:
    model, slots = _slots(tiny_model_dir)
    caches = [slots.new_cache() for _ in range(6)]
    with torch.inference_mode():
        for i, cache in enumerate(caches):
            model(input_ids=torch.arange(16 + i, 20 + 2 * i)[None], use_cache=True, **cache_kwargs(model, cache))
    contents = [(c.layers[1].keys.clone(), c.layers[2].values.clone()) for c in caches]
    assert [c.slot for c in caches] == list(range(6))
    del caches[1]  # frees slot 1
    assert slots.num_free == slots.num_slots - 5
    del contents[1]
    batch = SlotBatch([caches[4], caches[3], caches[2]])  # slots 5, 4, 3: two go to slots 0 and 1 (free)
    assert sorted(c.slot for c in batch.caches) == [0, 1, 2]
    assert [c.slot for c in batch.caches] == [0, 1, 2], "the batch's rows are in slot order"
    assert [batch.caches[i] for i in range(3)] == [[caches[4], caches[3], caches[2]][i] for i in batch.order]
    held = sorted(c.slot for c in caches)
    assert len(set(held)) == 5 and slots.num_free == slots.num_slots - 5, "a slot is held twice or lost"
    for cache, (keys, values) in zip(caches, contents, strict=True):
        assert torch.equal(cache.layers[1].keys, keys) and torch.equal(cache.layers[2].values, values)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=4),
    SamplingParams(temperature=1.2, top_p=0.8),
])
def test_sampled_frequencies_follow_the_sampling_distribution(params: SamplingParams) -> None:
    rows = 4000
    logits_V = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])
    sampled = sample_rows(logits_V.expand(rows, -1), [params] * rows, [make_generator(s) for s in range(rows)])
    counts = torch.bincount(torch.tensor([t for t, _ in sampled]), minlength=6).float() / rows
    expected = sampling_logprobs(logits_V, params).exp()
    assert (counts - expected).abs().max() < 0.03, (counts, expected)
    assert counts[expected == 0].sum() == 0, "a token outside the sampling distribution was drawn"
