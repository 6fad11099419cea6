"""bench/peer_turn.py end to end, tiny: every variant completes turns against its simulated server, and the
OpenAI-compatible simulation answers with vLLM's token-level fields."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from tokenizers import Tokenizer

from bench.peer_turn import VARIANTS, main_async, parse_args
from bench.sim_openai import make_app
from bench.sim_replies import CommandMix, ReplyBook, ReplySettings


def test_sim_openai_returns_token_ids_logprobs_and_text(tiny_model_dir: Path) -> None:
    tok_file = tiny_model_dir / "tokenizer.json"
    book = ReplyBook(tok_file, ReplySettings(20, 60, CommandMix.FAST))
    tok = Tokenizer.from_file(str(tok_file))
    client = TestClient(make_app(book, tok, 0.0))
    body = client.post("/v1/completions", json={"model": "sim", "prompt": [1, 2, 3], "max_tokens": 40}).json()
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) <= 40
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=False)
    assert np.all(np.asarray(choice["logprobs"]["token_logprobs"]) <= 0) and body["usage"]["prompt_tokens"] == 3
    assert client.post("/v1/completions", json={"model": "sim", "prompt": []}).status_code == 400


@pytest.mark.slow
async def test_every_variant_completes_turns(tiny_model_dir: Path) -> None:
    args = parse_args(["--sessions", "3", "--rounds", "1", "--round-s", "1", "--per-request-ms", "50",
                       "--model", str(tiny_model_dir)])
    out = await main_async(args)
    assert set(out["summary"]) == set(VARIANTS)
    for rounds in out["rounds"].values():
        assert rounds[0]["turns"] > 0 and rounds[0]["cpu_ms_per_turn"] > 0
