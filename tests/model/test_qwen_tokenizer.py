# ruff: noqa: RUF001  (full-width characters are test text)
"""The real Qwen tokenizer, built offline (t1/model/qwen_tokenizer.py), and the `qwen3-vocab` preset.

Checked against token ids published in public test files, and against tiktoken's own BPE on the same
ranks and split regex over varied text, before anything trusts it."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from t1.model.qwen_tokenizer import (
    ADDED_TOKENS,
    NUM_RANKS,
    QWEN3_VOCAB,
    qwen3_tokenizer,
    qwen_ranks_path,
)

# Published expected ids of Qwen's tokenizer (Qwen/Qwen-tokenizer, the vocabulary Qwen2, 2.5 and 3 share):
# transformers' tests/models/qwen2/test_tokenization_qwen2.py (test_tokenizer_integration), read at
# jklj077/transformers f4624a0a883b11263e00e8324749c7473993dbb9; rtp-llm's Qwen2 tokenizer test
# (alibaba/rtp-llm maga_transformer/test/tokenizer_test/qwen2_tokenizer_test.py); and the Qwen3-8B /
# Qwen2.5-7B encoding quoted in io.teknek deliverance's QwenTokenizerTest.
PUBLISHED: list[tuple[str, list[int]]] = [
    (
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [
            8963,
            388,
            320,
            69514,
            3881,
            438,
            4510,
            27414,
            32852,
            388,
            323,
            4510,
            27414,
            21334,
            35722,
            1455,
            529,
            8,
            5707,
            4586,
            58238,
            77235,
            320,
            61437,
            11,
            479,
            2828,
            12,
            17,
            11,
            11830,
            61437,
            64,
            11,
            1599,
            10994,
            11,
            27604,
            321,
            33,
            529,
            11,
            29881,
            6954,
            32574,
            369,
            18448,
            11434,
            45451,
            320,
            45,
            23236,
            8,
            323,
            18448,
            11434,
            23470,
            320,
            30042,
            38,
            8,
            448,
            916,
            220,
            18,
            17,
            10,
            80669,
            4119,
            304,
            220,
            16,
            15,
            15,
            10,
            15459,
            323,
            5538,
            94130,
            2897,
            1948,
            619,
            706,
            11,
            5355,
            51,
            21584,
            323,
            94986,
            13,
        ],
    ),
    (
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，"  # noqa: E501
        "并且节省从头训练所需要的时间和资源。",
        [
            144834,
            80532,
            93685,
            83744,
            34187,
            73670,
            104261,
            29490,
            62189,
            103937,
            104034,
            102830,
            98841,
            104034,
            104949,
            9370,
            5333,
            58143,
            102011,
            1773,
            37029,
            98841,
            104034,
            104949,
            73670,
            101940,
            100768,
            104997,
            33108,
            100912,
            105054,
            90395,
            100136,
            106831,
            45181,
            64355,
            104034,
            113521,
            101975,
            33108,
            85329,
            1773,
        ],
    ),
    (
        '```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
        [
            73594,
            12669,
            198,
            85593,
            284,
            8979,
            37434,
            6387,
            10442,
            35722,
            445,
            48,
            16948,
            45274,
            16948,
            34841,
            3135,
            1138,
            85593,
            445,
            99489,
            3837,
            108386,
            6313,
            899,
            73594,
        ],
    ),
    ("<|im_start|>hello<|im_end|>", [151644, 14990, 151645]),
    (" hello sir. How are you Edward?", [23811, 27048, 13, 2585, 525, 498, 21891, 30]),
]


@pytest.fixture(scope="module")
def qwen():
    return qwen3_tokenizer()


@pytest.mark.parametrize("i", range(len(PUBLISHED)))
def test_encodings_equal_the_published_ids(qwen, i):
    text, ids = PUBLISHED[i]
    assert qwen.encode(text, add_special_tokens=False) == ids
    assert qwen.decode(ids, skip_special_tokens=False) == text


def test_added_tokens_have_qwen3s_ids(qwen):
    assert len(qwen) == NUM_RANKS + len(ADDED_TOKENS) == 151_669
    assert [qwen.convert_tokens_to_ids(t) for t, _ in ADDED_TOKENS] == list(range(151_643, 151_669))
    assert qwen.convert_tokens_to_ids(["<|im_end|>", "<think>", "</think>", "<tool_call>"]) == [
        151645,
        151667,
        151668,
        151657,
    ]


def _texts() -> list[str]:
    rng = random.Random(0)
    pieces = ["ls -la /tmp", "  ", "\n\n", "\t", "123456", "3.14159", "don't", "I'LL", "日本語のテキスト", "Ünïcödé",
              "🙂👍🏽", "{\"k\": [1, 2]}", "def f(x):\n    return x**2\n", "\r\n", "   trailing   ", "a" * 40,
              "ﬁ", "é", "Ω", "\u00a0", "x\u0301", "$HOME/.cache", "<tool_call>", "--flag=value", "０１２"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    texts += ["".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0x2FFF), rng.randint(0x4E00, 0x9FFF)]))
                      for _ in range(rng.randint(1, 60))) for _ in range(300)]
    return texts


def test_equals_tiktoken_on_the_same_ranks(qwen):
    """tiktoken (Qwen's own reference BPE) with the ranks, the split regex and the added tokens."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    from t1.model.tokenizer import SPLIT_PATTERN

    enc = tiktoken.Encoding("qwen", pat_str=SPLIT_PATTERN, mergeable_ranks=load_tiktoken_bpe(str(qwen_ranks_path())),
                            special_tokens={t: NUM_RANKS + i for i, (t, _) in enumerate(ADDED_TOKENS)})
    for text in _texts():
        text = unicodedata.normalize("NFC", text)  # Qwen's normalizer; tiktoken has none
        assert qwen.encode(text, add_special_tokens=False) == enc.encode(text, allowed_special="all"), text


def test_the_qwen3_vocab_preset(tmp_path: Path, qwen):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t1.model.init import init_model, qwen3_chat_template, why_make

    out = init_model(tmp_path / "m", "qwen3-vocab", seed=0)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == QWEN3_VOCAB and cfg["model_type"] == "qwen3_moe"
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template == qwen3_chat_template() == (
        Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3.jinja").read_text()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for text, ids in PUBLISHED:
        assert tok.encode(text, add_special_tokens=False) == ids
    assert tok.get_vocab() == qwen.get_vocab()
    prompt = tok.apply_chat_template([{"role": "user", "content": "ls"}], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert model(torch.tensor([tok.encode(prompt)])).logits.shape[-1] == QWEN3_VOCAB
    assert why_make(out, "qwen3-vocab", 0) is None and why_make(out, "tiny", 0) is not None
