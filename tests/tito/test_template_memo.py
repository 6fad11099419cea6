"""The fast path of ChatRenderer: memoised template shapes and the direct tokenizers codec give exactly the
reference path's text and ids, and templates that use message content beyond concatenation are refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tito_families import get_family

from t1.inference.types import FinishReason, GenerateResult
from t1.tito.buffer import MismatchPolicy, TokenBuffer
from t1.tito.render import ChatRenderer
from t1.tito.tokenizer_fast_path import direct_codec
from t1.trajectory.types import EpisodeStatus

NEUTRAL = {"role": "user", "content": "x"}
ROLES = {"chatml": ("tool", "user"), "llama3": ("ipython", "user", "tool")}
# Pieces of text the templates and tokenizers treat specially, mixed with arbitrary text.
TRICKY = ["</think>", "<think>", "\n", " ", "{{", "}}", "{0}", "\\", '"', "é", "日本", "<|im_end|>", "<|eot_id|>",
          "<tool_response>", "stop", "\x1e", "\x1f"]
texts = st.lists(st.sampled_from(TRICKY) | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                                   max_size=12), max_size=5).map("".join)


def renderers(name: str) -> tuple[ChatRenderer, ChatRenderer]:
    fam = get_family(name)
    return (ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn),
            ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn, fast=False))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["chatml", "llama3"]), last=texts, think=st.booleans(), agp=st.booleans(),
       new=st.lists(st.tuples(st.integers(0, 2), texts), max_size=3))
def test_memoised_anchor_renders_are_the_template_renders_and_tokenize_the_same(name, last, think, agp, new):
    fast, ref = renderers(name)
    roles = ROLES[name]
    content = ("<think>\nplan\n</think>\n\n" if think else "") + last
    messages = [NEUTRAL, {"role": "assistant", "content": content},
                *({"role": roles[r % len(roles)], "content": t} for r, t in new)]
    assert fast.memo is not None
    text = fast.memo.render(messages, agp, fixed=1)
    want = ref.render(messages, agp)
    assert text == want
    assert fast.encode(text) == ref.encode(want)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_tool_observation_shapes_are_memoised(name):
    fast, _ = renderers(name)
    assert fast.memo is not None and not fast.memo.disabled
    role = ROLES[name][0]
    for content in ("reply", ""):
        anchor = [NEUTRAL, {"role": "assistant", "content": content}]
        assert fast.memo.refusal(anchor, False, fixed=1) is None
        assert fast.memo.refusal([*anchor, {"role": role, "content": "out"}], True, fixed=1) is None
        assert fast.memo.refusal([*anchor, {"role": role, "content": "a"}, {"role": role, "content": ""}],
                                 True, fixed=1) is None


def test_reasoning_stripped_before_a_user_turn_is_refused_and_rendered_by_the_template():
    """ChatML (Qwen3-style) tests `'</think>' in content` of an assistant turn followed by a user turn."""
    fast, ref = renderers("chatml")
    assert fast.memo is not None
    anchor = [NEUTRAL, {"role": "assistant", "content": "<think>\nplan\n</think>\n\n"
                                                        "ls"}, {"role": "user", "content": "q"}]
    assert "__contains__" in (fast.memo.refusal(anchor, True, fixed=1) or "")
    assert fast.memo.render(anchor, True, fixed=1) == ref.render(anchor, True)
    assert "plan" not in ref.render(anchor, True)


def test_messages_with_other_fields_are_rendered_by_the_template():
    fast, ref = renderers("chatml")
    assert fast.memo is not None
    call = {"role": "assistant", "content": "run", "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]}
    messages = [NEUTRAL, call, {"role": "tool", "content": "a.txt"}]
    assert "fields" in (fast.memo.refusal(messages, True, fixed=1) or "")
    assert fast.memo.render(messages, True, fixed=1) == ref.render(messages, True)


CONCAT = ("{%- for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>' + m.content + '<|eot_id|>' "
          "}}{%- endfor %}")
# Each renders more than the contents concatenated (or reads the clock); a content that hits the difference.
INSPECTING = {
    "upper": ("{%- for m in messages %}{{- m.content | upper }}{%- endfor %}", "quiet"),
    "trim": ("{%- for m in messages %}[{{- m.content | trim }}]{%- endfor %}", "  padded  "),
    "length": ("{%- for m in messages %}{%- if m.content | length > 4 %}LONG{% endif %}{{- m.content }}{%- endfor %}",
               "longer than four"),
    "compare": ("{%- for m in messages %}{%- if m.content == 'stop' %}STOP{%- else %}{{- m.content }}{%- endif %}"
                "{%- endfor %}", "stop"),
    "slice": ("{%- for m in messages %}{{- m.content[:3] }}{%- endfor %}", "truncated"),
    "substring": ("{%- for m in messages %}{%- if 'secret' in m.content %}[redacted]{%- else %}{{- m.content }}"
                  "{%- endif %}{%- endfor %}", "a secret"),
    "startswith": ("{%- for m in messages %}{%- if m.content.startswith('#') %}{%- else %}{{- m.content }}{%- endif %}"
                   "{%- endfor %}", "# comment"),
    "clock": ("{%- for m in messages %}{{- m.content + strftime_now('%Y') }}{%- endfor %}", "now"),
    "tojson": ("{%- for m in messages %}{{- m.content | tojson }}{%- endfor %}", 'say "hi"'),
    "replace": ("{%- for m in messages %}{{- m.content | replace('\\n', ' ') }}{%- endfor %}", "two\nlines"),
    # `~` yields a plain str that tracing cannot follow; the second content set holds 'secret' and
    # takes the other branch, so the pieces check refuses it.
    "concat_then_test": ("{%- for m in messages %}{%- set c = '' ~ m.content %}{%- if 'secret' in c %}[redacted]"
                         "{%- else %}{{- c }}{%- endif %}{%- endfor %}", "a secret"),
}


def renderer_with_template(template: str) -> tuple[ChatRenderer, ChatRenderer]:
    fam = get_family("llama3")
    tok = copy.deepcopy(fam.tokenizer)
    # Each message closed with the end-of-turn token, as a chat template does (the renderer refuses
    # a template that never writes it after an assistant turn).
    tok.chat_template = template.replace("{%- endfor %}", "{{- '<|eot_id|>' }}{%- endfor %}")
    return ChatRenderer(tok, end_of_turn=fam.end_of_turn), ChatRenderer(tok, end_of_turn=fam.end_of_turn, fast=False)


def test_a_concatenating_template_is_memoised():
    fast, ref = renderer_with_template(CONCAT)
    assert fast.memo is not None
    messages = [NEUTRAL, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}]
    assert fast.memo.refusal(messages, True, fixed=1) is None
    for content in INSPECTING.values():
        probe = [NEUTRAL, {"role": "assistant", "content": content[1]}, {"role": "tool", "content": content[1]}]
        assert fast.memo.render(probe, True, fixed=1) == ref.render(probe, True)


@pytest.mark.parametrize("kind", sorted(INSPECTING))
def test_a_template_that_uses_content_otherwise_is_detected_and_falls_back(kind):
    template, hit = INSPECTING[kind]
    fast, ref = renderer_with_template(template)
    assert fast.memo is not None and not fast.memo.disabled
    for fixed, messages in ((1, [NEUTRAL, {"role": "assistant", "content": "plain"}, {"role": "tool", "content": "x"}]),
                            (0, [{"role": "tool", "content": "x"}])):
        assert fast.memo.refusal(messages, True, fixed=fixed) is not None
        for content in (hit, "plain", ""):
            probe = [*messages[:-1], {"role": "tool", "content": content}]
            assert fast.memo.render(probe, True, fixed=fixed) == ref.render(probe, True)


def test_the_direct_codec_is_used_for_both_families():
    for name in ("chatml", "llama3"):
        fam = get_family(name)
        fast = ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn)
        assert fast._codec is not None


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["chatml", "llama3"]), text=texts, ids=st.lists(st.integers(0, 399), max_size=40))
def test_direct_encode_and_decode_are_the_wrappers(name, text, ids):
    fam = get_family(name)
    fast = ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn)
    tok = fam.tokenizer
    assert fast.encode(text) == tok.encode(text, add_special_tokens=False)
    assert fast.decode(ids) == tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert fast.decode(np.asarray(ids, np.int32)) == fast.decode(ids)


def test_byte_level_decode_goes_through_the_byte_table_and_matches_the_backend_on_long_sequences():
    rng = np.random.default_rng(0)
    for name in ("chatml", "llama3"):
        fam = get_family(name)
        codec = ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn)._codec
        assert codec is not None and codec._bytes is not None
        backend = fam.tokenizer.backend_tokenizer
        vocab = backend.get_vocab_size(with_added_tokens=True)
        for n in (1, 7, 225, 2000):
            ids = rng.integers(0, vocab, n).tolist()
            assert codec.decode(ids) == backend.decode(ids, skip_special_tokens=False)
        # An id the vocabulary lacks goes to the backend, which drops it.
        assert codec.decode([5, vocab + 10, 6]) == backend.decode([5, vocab + 10, 6], skip_special_tokens=False)


def test_a_byte_table_that_decodes_differently_from_the_backend_is_not_used(monkeypatch):
    import t1.tito.tokenizer_fast_path as codec_module

    fam = get_family("chatml")
    real = codec_module.byte_level_table

    def off_by_one_byte(backend):
        table = real(backend)
        first = min(i for i in table if i not in backend.get_added_tokens_decoder())
        table[first] = table[first] + b"!"
        return table

    monkeypatch.setattr(codec_module, "byte_level_table", off_by_one_byte)
    monkeypatch.setattr(codec_module, "_VERIFIED_TABLES", {})  # a table checked earlier is reused, not rebuilt
    codec = direct_codec(fam.tokenizer, fam.end_of_turn)
    assert codec is not None and codec._bytes is None
    ids = list(range(60))
    assert codec.decode(ids) == fam.tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)


def test_renderers_of_one_tokenizer_share_one_checked_byte_table(monkeypatch):
    import t1.tito.tokenizer_fast_path as codec_module

    monkeypatch.setattr(codec_module, "_VERIFIED_TABLES", {})
    tok = copy.deepcopy(get_family("chatml").tokenizer)
    a, b = (ChatRenderer(tok, end_of_turn="<|im_end|>") for _ in range(2))
    assert a._codec is not None and b._codec is not None and a._codec._bytes is b._codec._bytes is not None
    other = copy.deepcopy(tok)  # another backend: its own table
    c = ChatRenderer(other, end_of_turn="<|im_end|>")
    assert c._codec is not None and c._codec._bytes is not a._codec._bytes


def test_direct_encode_resets_backend_state_as_the_wrapper_does():
    fam = get_family("chatml")
    tok = copy.deepcopy(fam.tokenizer)
    fast = ChatRenderer(tok, end_of_turn=fam.end_of_turn)
    text = "a long enough text to be cut by truncation " * 3
    full = fast.encode(text)
    tok.backend_tokenizer.enable_truncation(max_length=3)
    tok.backend_tokenizer.enable_padding(length=500)
    assert fast.encode(text) == full
    tok.backend_tokenizer.enable_truncation(max_length=3)
    assert tok.encode(text, add_special_tokens=False) == full


def test_tokenizers_that_change_the_pipeline_get_no_direct_codec():
    fam = get_family("chatml")

    class Lowercasing(type(fam.tokenizer)):  # type: ignore[misc]
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).lower()

    tok = copy.deepcopy(fam.tokenizer)
    tok.__class__ = Lowercasing
    assert direct_codec(tok, fam.end_of_turn) is None
    assert direct_codec(object(), fam.end_of_turn) is None


class FakeTokenizer:
    """The ChatTokenizer protocol without transformers: the fast path must fall back to it entirely."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def apply_chat_template(self, conversation, **kwargs):
        return self.inner.apply_chat_template(conversation, **kwargs)

    def encode(self, text, **kwargs):
        return self.inner.encode(text, **kwargs)

    def decode(self, token_ids, **kwargs):
        return self.inner.decode(token_ids, **kwargs)


def test_a_protocol_only_tokenizer_uses_the_reference_path():
    fam = get_family("llama3")
    r = ChatRenderer(FakeTokenizer(fam.tokenizer), end_of_turn=fam.end_of_turn)
    assert r._codec is None and r.memo is not None and r.memo.disabled
    messages = [NEUTRAL, {"role": "assistant", "content": "a"}, {"role": "ipython", "content": "b"}]
    ref = ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn, fast=False)
    assert r.delta(messages[:1], messages[1], "a<|eot_id|>", messages[2:]) == \
        ref.delta(messages[:1], messages[1], "a<|eot_id|>", messages[2:])


turn = st.tuples(st.integers(0, 10), st.booleans(), st.sampled_from(["obs", "obs2", "user"]), texts, st.booleans())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["chatml", "llama3"]), turns=st.lists(turn, min_size=1, max_size=6),
       seed=st.integers(0, 2**16), policy=st.sampled_from(list(MismatchPolicy)), check_every=st.sampled_from([0, 2]))
def test_fast_and_reference_buffers_hold_the_same_episode(name, turns, seed, policy, check_every):
    fast, ref = renderers(name)
    role = ROLES[name][0]
    opening = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    bufs = [TokenBuffer(r, opening, on_mismatch=policy, full_check_every=check_every) for r in (fast, ref)]
    rng = np.random.default_rng(seed)
    eot = list(fast.end_of_turn_ids)
    for n, stop, kind, text, think in turns:
        ids = [int(i) for i in rng.integers(0, 400, size=n) if i not in eot] + (eot if stop else [])
        message = {"role": "assistant", "content": "<think>\nplan\n</think>\n\n" + text} if think else None
        obs = [{"role": "user" if kind == "user" else role, "content": text}]
        if kind == "obs2":
            obs.append({"role": role, "content": text[::-1]})
        for buf in bufs:
            res = GenerateResult(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.5, np.float32),
                                 finish_reason=FinishReason.STOP, policy_version=1,
                                 token_versions=np.full(len(ids), 1, np.int32), routing=None,
                                 prompt_tokens=len(buf.prompt_ids()))
            buf.append_generation(res, message)
            buf.append_observation(obs)
        assert np.array_equal(bufs[0].prompt_ids(), bufs[1].prompt_ids())
        assert bufs[0].counters == bufs[1].counters and bufs[0].num_segments == bufs[1].num_segments
    a, b = (buf.export(id="t", task_id="t", group_id="g", attempt=0, reward=0.0, status=EpisodeStatus.OK)
            for buf in bufs)
    assert a.tito == b.tito and len(a.segments) == len(b.segments)
    for sa, sb in zip(a.segments, b.segments, strict=True):
        assert np.array_equal(sa.token_ids, sb.token_ids) and np.array_equal(sa.loss_mask, sb.loss_mask)
