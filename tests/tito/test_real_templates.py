"""TITO under the real chat templates of the families teams train (tests/fixtures/chat_templates): every
scenario runs to the end with no exception, drift 0 in the loss region, the buffer's context equal to the
template's own rendering unless a mismatch was counted, and each mismatch counted with its cause.

EXPECTED is the family x scenario table of docs/fidelity.md: under `repair`, the causes counted (the
episode keeps one segment); under `new_segment` the same mismatches each start a segment."""

from __future__ import annotations

import pytest
from real_templates import FAMILIES, TEMPLATES, Scenario, make_tokenizer, run_session

from t1.model.qwen_tokenizer import qwen3_tokenizer
from t1.tito.buffer import MismatchPolicy
from t1.tito.render import ChatRenderer, turn_ends

GP, RS, HI, TU = "generation_prompt", "reasoning", "history", "turn"
# (family, scenario, thinking) -> {cause: count} under repair; {} is one segment equal to the template's rendering.
EXPECTED: dict[tuple[str, str, bool], dict[str, int]] = {
    ("qwen3", Scenario.TOOLS, True): {}, ("qwen3", Scenario.TOOLS, False): {GP: 5},
    ("qwen3", Scenario.USER_MID, True): {RS: 1}, ("qwen3", Scenario.USER_MID, False): {GP: 5},
    ("qwen3.5", Scenario.TOOLS, True): {}, ("qwen3.5", Scenario.TOOLS, False): {},
    ("qwen3.5", Scenario.USER_MID, True): {RS: 1}, ("qwen3.5", Scenario.USER_MID, False): {HI: 1},
    ("qwen3-coder", Scenario.TOOLS, False): {}, ("qwen3-coder", Scenario.USER_MID, False): {},
    ("glm-4.6", Scenario.TOOLS, True): {}, ("glm-4.6", Scenario.TOOLS, False): {},
    ("glm-4.6", Scenario.USER_MID, True): {RS: 1}, ("glm-4.6", Scenario.USER_MID, False): {},
    ("deepseek-v3.1", Scenario.TOOLS, True): {}, ("deepseek-v3.1", Scenario.TOOLS, False): {},
    ("deepseek-v3.1", Scenario.USER_MID, True): {}, ("deepseek-v3.1", Scenario.USER_MID, False): {},
    ("kimi-k2", Scenario.TOOLS, False): {}, ("kimi-k2", Scenario.USER_MID, False): {},
    ("gpt-oss", Scenario.TOOLS, True): {}, ("gpt-oss", Scenario.TOOLS, False): {},
    ("gpt-oss", Scenario.USER_MID, True): {RS: 1}, ("gpt-oss", Scenario.USER_MID, False): {TU: 1},
}

_TOKENIZERS: dict[str, object] = {}


def tokenizer(name: str):
    """The real Qwen tokenizer for the Qwen families (built once per process), a small BPE for the others."""
    if name not in _TOKENIZERS:
        fam = FAMILIES[name]
        if fam.qwen and "qwen" not in _TOKENIZERS:
            _TOKENIZERS["qwen"] = qwen3_tokenizer()
        _TOKENIZERS[name] = make_tokenizer(fam, _TOKENIZERS.get("qwen") if fam.qwen else None)
    return _TOKENIZERS[name]


def test_every_vendored_template_is_run_or_refused_here():
    used = {f.template for f in FAMILIES.values()} | {"kimi_k2_llamacpp"}  # the last: refused at load, below
    assert {p.stem for p in TEMPLATES.glob("*.jinja")} == used


def test_the_table_covers_every_family_scenario_and_thinking_mode():
    want = {(f.name, s, t) for f in FAMILIES.values() for s in (Scenario.TOOLS, Scenario.USER_MID)
            for t in ((True, False) if f.thinking else (False,))}
    assert set(EXPECTED) == want


@pytest.mark.parametrize("policy", list(MismatchPolicy))
@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-{k[1]}-{'think' if k[2] else 'nothink'}")
def test_each_family_runs_every_scenario_to_the_end(key, policy):
    name, scenario, thinking = key
    res = run_session(FAMILIES[name], tokenizer(name), scenario, thinking, policy)
    causes = {c.value: n for c, n in res.buffer.mismatch_causes.items()}
    assert causes == EXPECTED[key]
    assert res.drift == 0
    mismatches = sum(causes.values())
    assert res.buffer.counters.template_mismatches == mismatches
    if policy is MismatchPolicy.NEW_SEGMENT:
        assert res.buffer.num_segments == 1 + mismatches
        assert all(res.equals_template)  # each mismatch restarted from the template's rendering
    else:
        assert res.buffer.num_segments == 1
        assert all(res.equals_template) == (mismatches == 0)
    assert res.retokenized[0] > 0  # the non-canonical split a re-tokenizing pipeline would change


# What the renderer's end of turn and stop texts are, found from the template and the sampler's stop tokens.
TURN_ENDS = {
    "qwen3": ("<|im_end|>", ()), "qwen3.5": ("<|im_end|>", ()), "qwen3-coder": ("<|im_end|>", ()),
    "glm-4.6": ("<|user|>", ("<|endoftext|>", "<|observation|>")),
    "deepseek-v3.1": ("<｜end▁of▁sentence｜>", ()),  # noqa: RUF001 (DeepSeek's token)
    "kimi-k2": ("<|im_end|>", ()), "gpt-oss": ("<|call|>", ("<|return|>",)),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_turn_ends_are_found_from_the_template_and_the_sampler_stops(name):
    fam = FAMILIES[name]
    assert turn_ends(tokenizer(name), fam.eos, fam.sampler_stops) == TURN_ENDS[name]


@pytest.mark.parametrize("name", ["glm-4.6", "gpt-oss"])
def test_a_model_folder_of_a_family_that_stops_otherwise_loads_in_the_coordinator(name, tmp_path):
    """generation_config.json's eos ids tell make_renderers what else ends a turn; with the tokenizer's eos
    alone (GLM's <|endoftext|>, gpt-oss's <|return|>) the template would be refused."""
    import json

    from t1.coordinator.model_setup import make_renderers

    fam = FAMILIES[name]
    tok = make_tokenizer(fam)
    tok.save_pretrained(str(tmp_path))
    ids = tok.convert_tokens_to_ids(list(fam.sampler_stops))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    for renderer in make_renderers(tmp_path).values():
        assert (renderer.end_of_turn, renderer.stop_texts) == TURN_ENDS[name]
    with pytest.raises(ValueError, match="never writes the end-of-turn text"):
        ChatRenderer(tok, end_of_turn=fam.eos)
    (tmp_path / "generation_config.json").unlink()
    with pytest.raises(ValueError, match=r"inference\.model\.path: the chat template .* never writes"):
        make_renderers(tmp_path)


def test_a_template_that_raises_on_tool_calls_is_refused_at_load():
    """llama.cpp's Kimi K2 template appends to a list, which transformers' sandbox forbids: with tools the
    renderer refuses it when it is made, naming the template's error, not in the middle of an episode."""
    tok = make_tokenizer(FAMILIES["kimi-k2"])
    tok.chat_template = (TEMPLATES / "kimi_k2_llamacpp.jinja").read_text()
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(ValueError, match=r"cannot render an assistant turn with tool calls.*unsafe"):
        ChatRenderer(tok, end_of_turn="<|im_end|>", tools=tools)
    ChatRenderer(tok, end_of_turn="<|im_end|>")  # without tools no tool call is rendered: accepted


def test_an_end_of_turn_the_template_never_writes_is_refused_at_load():
    tok = tokenizer("qwen3")
    with pytest.raises(ValueError, match="never writes the end-of-turn text"):
        ChatRenderer(tok, end_of_turn="<|endoftext|>")


SYSTEM_FIRST = ("{%- if messages[0].role != 'system' %}{{- raise_exception('the first message must be the system "
                "prompt') }}{%- endif %}" + (TEMPLATES / "qwen3.jinja").read_text())


def test_a_template_that_wants_its_system_message_first_gets_deltas_in_the_whole_history():
    """The bounded anchor starts with a neutral user turn; a template that refuses that is rendered with the
    real history instead (O(context) for it), and the episode runs as under the template it wraps."""
    tok = make_tokenizer(FAMILIES["qwen3"], tokenizer("qwen3"))
    tok.chat_template = SYSTEM_FIRST
    fam = FAMILIES["qwen3"]
    res = run_session(fam, tok, Scenario.USER_MID, False)
    assert {c.value: n for c, n in res.buffer.mismatch_causes.items()} == EXPECTED[("qwen3", Scenario.USER_MID, False)]
    assert res.drift == 0
