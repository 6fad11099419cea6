"""Chunked logprobs and entropy on packed rows equal the unchunked, one-sequence-per-forward
reference: values within 1e-5 and every parameter gradient within 1e-4 (tiny model, float32),
with temperature, replayed routing and the critic; tokens off the loss mask never reach the head."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_synth import routed_sequences, take_grads

from t1.trainer import token_stats
from t1.trainer.models import (
    checkpoint_layers,
    critic_values,
    load_critic,
    load_policy,
    maybe_replay,
)
from t1.trainer.packing import pack
from t1.trainer.token_stats import chunked_token_stats, policy_token_stats

CPU = torch.device("cpu")


def _assert_grads_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def _weights(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss weights of a token mean (as the PPO loss is), random in sign and size."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) / n, torch.randn(n, generator=g) / n


@pytest.mark.parametrize(("temperature", "replay"), [(1.0, False), (0.7, True), (1.3, True)])
def test_chunked_packed_equals_unchunked_per_sequence(tiny_model_dir: Path, temperature: float,
                                                      replay: bool) -> None:
    model = load_policy(tiny_model_dir)
    cfg = model.config
    seqs = routed_sequences(cfg.num_experts, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    packed = pack(seqs)
    g_lp, g_ent = _weights(packed.num_actions, seed=1)
    # chunk 4 over 24 action tokens: several chunks and a ragged last one
    with maybe_replay(model, packed, replay) as rstats:
        s = policy_token_stats(model, packed, CPU, temperature=temperature, chunk_tokens=4)
    (s.logp_N * g_lp + s.entropy_N * g_ent).sum().backward()
    chunked = take_grads(model)
    if replay:
        assert rstats is not None and rstats.coverage == 1.0
    ref_lp, ref_ent = [], []
    for seq in seqs:  # the reference: one sequence per forward, full logits
        one = pack([seq])
        with maybe_replay(model, one, replay):
            r = policy_token_stats(model, one, CPU, temperature=temperature, chunk_tokens=0)
        ref_lp.append(r.logp_N)
        ref_ent.append(r.entropy_N)
    lp, ent = torch.cat(ref_lp), torch.cat(ref_ent)
    (lp * g_lp + ent * g_ent).sum().backward()
    naive = take_grads(model)
    torch.testing.assert_close(s.logp_N, lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(s.entropy_N, ent, atol=1e-5, rtol=0)
    _assert_grads_close(chunked, naive)
    if replay:  # the recorded experts are random: replay must have changed the result
        with torch.no_grad():
            live = policy_token_stats(model, packed, CPU, temperature=temperature, chunk_tokens=4)
        assert (live.logp_N - s.logp_N).abs().max() > 1e-3


def test_tokens_off_the_loss_mask_never_reach_the_head(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_policy(tiny_model_dir)
    cfg = model.config
    seqs = routed_sequences(cfg.num_experts, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    packed = pack(seqs)
    rows: list[int] = []

    def spy(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor, *, temperature: float,
            chunk_tokens: int) -> token_stats.TokenStats:
        rows.append(int(hidden_NH.shape[0]))
        return chunked_token_stats(hidden_NH, weight_VH, targets_N, temperature=temperature, chunk_tokens=chunk_tokens)

    monkeypatch.setattr(token_stats, "chunked_token_stats", spy)
    s = policy_token_stats(model, packed, CPU, temperature=1.0, chunk_tokens=8)
    n_actions = sum(int(q.loss_mask[1:].sum()) for q in seqs)
    assert rows == [n_actions] and s.logp_N.shape == (n_actions,)
    assert n_actions < int(packed.input_ids.shape[1]) - 10


def test_critic_on_packed_rows_equals_one_sequence_per_forward(tiny_model_dir: Path) -> None:
    critic = load_critic(tiny_model_dir)
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # a zero head would hide differences
    cfg = critic.backbone.config
    seqs = routed_sequences(cfg.num_experts, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    packed = pack(seqs)
    v = critic_values(critic, packed, CPU)[0]
    g = torch.randn(v.shape[0], generator=torch.Generator().manual_seed(2)) / v.shape[0]
    (v * g).sum().backward()
    packed_grads = take_grads(critic)
    ref = torch.cat([critic_values(critic, pack([q]), CPU)[0] for q in seqs])
    (ref * g).sum().backward()
    torch.testing.assert_close(v, ref, atol=1e-5, rtol=0)
    _assert_grads_close(packed_grads, take_grads(critic))


def test_chunked_head_gradient_matches_autograd_in_float64() -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(11, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(17, 6, dtype=torch.float64, generator=g, requires_grad=True)
    t = torch.randint(0, 17, (11,), generator=g)

    def f(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        s = chunked_token_stats(h, w, t, temperature=0.8, chunk_tokens=3)
        return torch.cat([s.logp_N, s.entropy_N])

    assert torch.autograd.gradcheck(f, (h, w))
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_token_stats(h, w, t, temperature=1.0, chunk_tokens=0)


def test_checkpointed_layers_with_replay_give_the_same_gradients(tiny_model_dir: Path) -> None:
    """Recomputation in backward replays the same experts: checkpointing changes memory, not results."""
    model = load_policy(tiny_model_dir)
    cfg = model.config
    packed = pack(routed_sequences(cfg.num_experts, cfg.num_hidden_layers, cfg.num_experts_per_tok))
    g_lp, g_ent = _weights(packed.num_actions, seed=3)
    grads = []
    for on in (False, True):
        checkpoint_layers(model, on)
        assert model.is_gradient_checkpointing == on
        model.train()
        with maybe_replay(model, packed, True):
            s = policy_token_stats(model, packed, CPU, temperature=1.0, chunk_tokens=5)
            (s.logp_N * g_lp + s.entropy_N * g_ent).sum().backward()
        grads.append(take_grads(model))
    _assert_grads_close(grads[0], grads[1])
