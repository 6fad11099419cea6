"""Micro-benchmark of the TITO buffer's per-turn cost against context length.

One turn = append_generation (canonical ids of an assistant reply + end of turn) + append_observation
(a tool result) + prompt_ids(). The buffer is grown turn by turn to each context size, then
--turns turns are timed one by one; the table gives the median and mean per-turn microseconds.
The tokenizer and chat template are the real tiny model's (t1.model.init, preset tiny, seed 0).

    .venv/bin/python bench/tito.py
    .venv/bin/python bench/tito.py --contexts 1000,10000,40000 --turns 60 --out bench/results/tito_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from t1.inference.types import FinishReason, GenerateResult
from t1.tito import ChatRenderer, TokenBuffer

REPLY = ("I will look at the build output first.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": "
         "{\"cmd\": \"cd /work && make -j2 2>&1 | tail -n 20\"}}\n</tool_call>")
OUTPUT = ("gcc -O2 -c main.c -o main.o\nmain.c:12:5: warning: unused variable 'x'\n"
          "ld: main.o: in function `main': undefined reference to `helper'\nmake: *** [all] Error 1\n") * 3


def tiny_tokenizer(root: Path):
    import torch
    from transformers import AutoTokenizer

    from t1.model.init import init_model

    torch.set_num_threads(1)
    return AutoTokenizer.from_pretrained(init_model(root / "tiny", "tiny", seed=0))


def one_turn(buf: TokenBuffer, reply: list[int]) -> None:
    ids = np.asarray(reply, np.int32)
    buf.append_generation(GenerateResult(
        token_ids=ids, logprobs=np.full(len(ids), -0.5, np.float32), finish_reason=FinishReason.STOP,
        policy_version=1, token_versions=np.full(len(ids), 1, np.int32), routing=None,
        prompt_tokens=len(buf.prompt_ids())))
    buf.append_observation([{"role": "tool", "content": OUTPUT}])
    buf.prompt_ids()


def measure(renderer: ChatRenderer, contexts: list[int], turns: int) -> list[dict]:
    reply = renderer.encode(REPLY) + list(renderer.end_of_turn_ids)
    opening = [{"role": "system", "content": "You are a shell agent."},
               {"role": "user", "content": "Fix the build in /work."}]
    buf = TokenBuffer(renderer, opening)
    rows = []
    for target in contexts:
        while len(buf.prompt_ids()) < target:
            one_turn(buf, reply)
        start_tokens = len(buf.prompt_ids())
        us = []
        for _ in range(turns):
            t0 = time.perf_counter()
            one_turn(buf, reply)
            us.append((time.perf_counter() - t0) * 1e6)
        rows.append({"context_tokens": start_tokens, "turns": turns, "median_us": statistics.median(us),
                     "mean_us": statistics.fmean(us), "max_us": max(us),
                     "template_mismatches": buf.counters.template_mismatches})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1000,10000,40000", help="context sizes in tokens, comma-separated")
    ap.add_argument("--turns", type=int, default=60, help="timed turns per context size")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    contexts = sorted(int(c) for c in args.contexts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        tok = tiny_tokenizer(Path(tmp))
        renderer = ChatRenderer(tok, end_of_turn=tok.eos_token)
        rows = measure(renderer, contexts, args.turns)
    print(f"{'context tokens':>15} {'median us/turn':>15} {'mean us/turn':>13} {'max us':>9} {'mismatches':>11}")
    for r in rows:
        print(f"{r['context_tokens']:>15} {r['median_us']:>15.0f} {r['mean_us']:>13.0f} {r['max_us']:>9.0f} "
              f"{r['template_mismatches']:>11}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
