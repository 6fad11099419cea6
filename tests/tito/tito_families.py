"""Two chat-template families for TITO tests with tokenizers trained here: Qwen3-style ChatML and Llama-3-style headers.

The ChatML template strips reasoning from assistant turns before the last user message and groups
tool results into a user turn, as Qwen3's does, so history rewriting is exercised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHATML_TEMPLATE = """\
{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' or message.role == 'user' %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content or '' %}
{%- if loop.index0 < ns.last_query and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content }}
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

LLAMA3_TEMPLATE = """\
{{- '<|begin_of_text|>' }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + (message.content or '') + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

CORPUS = [
    "ls -la /tmp && cat README.md | grep -n error", "def main():\n    print('hello world')\n",
    "The quick brown fox jumps over the lazy dog.", "total 12\ndrwxr-xr-x 2 root root 4096 .\n",
    "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: bad",
    "echo $HOME; export PATH=/usr/bin:$PATH; cd /work && make -j2",
    "Ünïcödé façade — naïve 日本語 テキスト ✓", "{\"name\": \"bash\", \"arguments\": {\"cmd\": \"pwd\"}}",
] * 20


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: object
    end_of_turn: str
    special_tokens: tuple[str, ...]


def _train(special: list[str], template: str, eos: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, chat_template=template,
                                   clean_up_tokenization_spaces=False)


def make_family(name: str) -> Family:
    if name == "chatml":
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                   "<tool_response>", "</tool_response>", "<think>", "</think>"]
        return Family(name, _train(special, CHATML_TEMPLATE, "<|im_end|>"), "<|im_end|>", tuple(special))
    if name == "llama3":
        special = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        return Family(name, _train(special, LLAMA3_TEMPLATE, "<|eot_id|>"), "<|eot_id|>", tuple(special))
    raise ValueError(name)


_FAMILIES: dict[str, Family] = {}


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        _FAMILIES[name] = make_family(name)
    return _FAMILIES[name]
