"""Property tests: over random conversations in both template families, the exported ids are exactly
what the sampler consumed and produced, and the loss mask covers only sampled tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tito_families import get_family

from t1.inference.types import FinishReason, GenerateResult
from t1.routing.block import RoutingBlock, sentinel
from t1.tito.buffer import MismatchPolicy, TokenBuffer
from t1.tito.diagnostics import segment_drift
from t1.tito.render import ChatRenderer
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
from t1.trajectory.types import EpisodeStatus

LAYERS, TOP_K = 3, 2


def routing_row(pos: int) -> np.ndarray:
    """A deterministic record per position, so alignment can be checked after export."""
    return np.array([[(pos + layer) % 8, (pos + layer + 1) % 8] for layer in range(LAYERS)], np.uint8)


@dataclass
class FakeSampler:
    """Follows the GenerateResult contract: sampled ids (an EOS or not), routing for positions it
    processed for the first time (its session cache), and the prompt it was given."""

    eot_id: int
    vocab: int
    rng: np.random.Generator
    calls: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)  # (segment, prompt, sampled)
    cached_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __call__(self, segment: int, prompt: np.ndarray, n: int, stop: bool) -> GenerateResult:
        # Like the real backend: reuse the longest common prefix of the session's cache.
        m = min(len(self.cached_ids), len(prompt))
        diff = np.flatnonzero(self.cached_ids[:m] != prompt[:m])
        cached = int(diff[0]) if len(diff) else m
        ids = self.rng.integers(0, self.vocab, size=n).astype(np.int32)
        ids = ids[ids != self.eot_id]
        if stop:
            ids = np.append(ids, np.int32(self.eot_id))
        end = len(prompt) + len(ids) - 1  # the last sampled token is not fed yet
        start = min(cached, end)
        rows = [routing_row(p) for p in range(start, end)]
        routing = RoutingBlock(start, np.stack(rows) if rows else np.zeros((0, LAYERS, TOP_K), np.uint8))
        self.cached_ids = np.concatenate([prompt, ids])[:-1]  # the last token is not fed yet
        self.calls.append((segment, prompt.copy(), ids))
        lp = -self.rng.random(len(ids)).astype(np.float32)
        return GenerateResult(
            token_ids=ids,
            logprobs=lp,
            finish_reason=FinishReason.STOP if stop else FinishReason.LENGTH,
            policy_version=3,
            token_versions=np.full(len(ids), 3, np.int32),
            routing=routing,
            prompt_tokens=len(prompt),
        )


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
turn = st.tuples(st.integers(0, 12), st.booleans(), st.sampled_from(["tool", "tool2", "user", "compact"]), texts,
                 st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family_name=st.sampled_from(["chatml", "llama3"]), turns=st.lists(turn, min_size=1, max_size=6),
       seed=st.integers(0, 2**16), policy=st.sampled_from(list(MismatchPolicy)), check_every=st.sampled_from([0, 1, 3]))
def test_exported_ids_are_what_the_sampler_consumed_and_produced(family_name, turns, seed, policy, check_every):
    fam = get_family(family_name)
    renderer = ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn)
    eot = renderer.end_of_turn_ids[-1]
    buf = TokenBuffer(renderer, [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}],
                      on_mismatch=policy, full_check_every=check_every)
    sampler = FakeSampler(eot, len(fam.tokenizer), np.random.default_rng(seed))
    seg_index, lengths = 0, 0
    for n, stop, kind, text, think in turns:
        segments_before = buf.num_segments
        res = sampler(seg_index, buf.prompt_ids(), n, stop)
        message = None
        if think:  # the agent's parse of the text differs from the sampled tokens: history re-serialised
            message = {"role": "assistant", "content": "<think>\nplan\n</think>\n\n" + text}
        buf.append_generation(res, message)
        lengths += 0 if stop else 1
        if kind == "compact":
            buf.compact([{"role": "system", "content": "sys"}, {"role": "user", "content": "summary: " + text}])
        else:
            obs = [{"role": "tool" if kind.startswith("tool") else "user", "content": text}]
            if kind == "tool2":
                obs.append({"role": "tool", "content": text[::-1]})
            buf.append_observation(obs)
        if buf.num_segments > segments_before:
            seg_index += 1
    traj = buf.export(id="t", task_id="task", group_id="g", attempt=0, reward=1.0, status=EpisodeStatus.OK)

    assert traj.tito.repaired_turns == lengths
    assert traj.tito.masked_tokens == lengths * len(renderer.end_of_turn_ids)
    by_segment: dict[int, list] = {}
    for s, prompt, ids in sampler.calls:
        by_segment.setdefault(s, []).append((prompt, ids))
    exported = [s for s in traj.segments if s.turns]
    assert len(exported) == len(by_segment)
    for seg, calls in zip(exported, by_segment.values(), strict=True):
        sampled_at = []
        for prompt, ids in calls:
            p = len(prompt)
            assert np.array_equal(seg.token_ids[:p], prompt)          # consumed: the exact context
            assert np.array_equal(seg.token_ids[p:p + len(ids)], ids)  # produced: the exact samples
            sampled_at.append((p, ids))
        last_prompt, last_ids = calls[-1]
        assert np.array_equal(seg.token_ids, np.concatenate([last_prompt, last_ids]))  # nothing else
        positions = np.concatenate([np.arange(p, p + len(ids)) for p, ids in sampled_at])
        mask = np.zeros(seg.num_tokens, bool)
        mask[positions] = True
        assert np.array_equal(seg.loss_mask, mask)                       # loss only on sampled tokens
        assert segment_drift(seg, sampled_at) == 0
        assert np.isnan(seg.logprobs[~mask]).all() and not np.isnan(seg.logprobs[mask]).any()
        assert (seg.policy_versions[mask] == 3).all() and (seg.policy_versions[~mask] == -1).all()
        assert [(t.start, t.end) for t in seg.turns] == [(p, p + len(ids)) for p, ids in sampled_at]
        last_fed = calls[-1][0].shape[0] + len(calls[-1][1]) - 1
        for pos in range(seg.num_tokens):
            if pos < last_fed:
                assert np.array_equal(seg.routing[pos], routing_row(pos)), pos
            else:  # not fed in this segment: missing, or carried from an identical earlier prefix
                missing = (seg.routing[pos] == sentinel(seg.routing.dtype)).all()
                assert missing or np.array_equal(seg.routing[pos], routing_row(pos)), pos
    again = decode_trajectory(encode_trajectory(traj))
    for a, b in zip(again.segments, traj.segments, strict=True):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.routing, b.routing)
