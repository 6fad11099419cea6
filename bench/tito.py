"""Micro-benchmark of the TITO buffer's per-turn CPU against context length: reference vs fast path, side by side.

One turn, as the agent episode does it: decode the sampled reply (the episode's transcript text),
append_generation (canonical ids of an assistant reply + end of turn), append_observation (a tool
result), prompt_ids(). Two buffers, one per renderer (fast=False: every delta rendered with the
chat template and tokenized through the transformers wrapper; fast=True: memoised shapes and the
direct `tokenizers` backend), are grown in lockstep from the opening to each context size, then
--turns turns of each are timed alternately (CPU time of this process, time.process_time_ns; the
machine is shared, so wall time is not used). Means include the full-history check every 32
turns, medians do not. Both buffers must hold the same ids and counters, or the run fails.
The tokenizer and chat template are the real tiny model's (t1.model.init, preset tiny, seed 0).

    .venv/bin/python bench/tito.py
    .venv/bin/python bench/tito.py --contexts 1000,10000,40000 --turns 96 --out bench/results/tito_cpu.json
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
PARTS = ("decode", "generation", "observation")
VARIANTS = ("reference", "fast")


def tiny_tokenizer(root: Path):
    import torch
    from transformers import AutoTokenizer

    from t1.model.init import init_model

    torch.set_num_threads(1)
    return AutoTokenizer.from_pretrained(init_model(root / "tiny", "tiny", seed=0))


def one_turn(buf: TokenBuffer, reply: list[int], turn: int) -> tuple[int, int, int]:
    """One agent turn; returns the CPU nanoseconds of its decode, append_generation, append_observation."""
    r = buf.renderer
    ids = np.asarray(reply, np.int32)
    result = GenerateResult(
        token_ids=ids, logprobs=np.full(len(ids), -0.5, np.float32), finish_reason=FinishReason.STOP,
        policy_version=1, token_versions=np.full(len(ids), 1, np.int32), routing=None,
        prompt_tokens=len(buf.prompt_ids()))
    observation = [{"role": "tool", "content": f"[{turn}] {OUTPUT}"}]
    t0 = time.process_time_ns()
    r.decode(reply[:len(reply) - len(r.end_of_turn_ids)])
    t1 = time.process_time_ns()
    buf.append_generation(result)
    t2 = time.process_time_ns()
    buf.append_observation(observation)
    buf.prompt_ids()
    t3 = time.process_time_ns()
    return t1 - t0, t2 - t1, t3 - t2


def summary(samples: list[tuple[int, int, int]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, part in enumerate(PARTS):
        out[f"{part}_median_us"] = statistics.median(s[k] for s in samples) / 1e3
    totals = [sum(s) for s in samples]
    out["total_median_us"] = statistics.median(totals) / 1e3
    out["total_mean_us"] = statistics.fmean(totals) / 1e3
    return out


def measure(tokenizer, contexts: list[int], turns: int) -> list[dict]:
    renderers = {v: ChatRenderer(tokenizer, end_of_turn=tokenizer.eos_token, fast=v == "fast") for v in VARIANTS}
    reply = renderers["reference"].encode(REPLY) + list(renderers["reference"].end_of_turn_ids)
    opening = [{"role": "system", "content": "You are a shell agent."},
               {"role": "user", "content": "Fix the build in /work."}]
    rows, turn = [], 0
    for target in contexts:
        bufs = {v: TokenBuffer(r, opening) for v, r in renderers.items()}
        while len(bufs["fast"].prompt_ids()) < target:
            for buf in bufs.values():
                one_turn(buf, reply, turn)
            turn += 1
        start_tokens = len(bufs["fast"].prompt_ids())
        samples: dict[str, list[tuple[int, int, int]]] = {v: [] for v in VARIANTS}
        for i in range(turns):
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
            for v in order:
                samples[v].append(one_turn(bufs[v], reply, turn))
            turn += 1
        ref, fast = bufs["reference"], bufs["fast"]
        if not (np.array_equal(ref.prompt_ids(), fast.prompt_ids()) and ref.counters == fast.counters):
            raise SystemExit(f"the fast path diverged from the reference at {start_tokens} tokens")
        row: dict = {"context_tokens": start_tokens, "turns": turns,
                     "template_mismatches": fast.counters.template_mismatches}
        for v in VARIANTS:
            row[v] = summary(samples[v])
        row["median_ratio"] = row["reference"]["total_median_us"] / row["fast"]["total_median_us"]
        row["mean_ratio"] = row["reference"]["total_mean_us"] / row["fast"]["total_mean_us"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1000,10000,40000", help="context sizes in tokens, comma-separated")
    ap.add_argument("--turns", type=int, default=96, help="timed turns per context size and variant")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    contexts = sorted(int(c) for c in args.contexts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(tiny_tokenizer(Path(tmp)), contexts, args.turns)
    print("CPU us per turn (median; mean includes the full-history check every 32 turns)")
    print(f"{'context':>8} {'variant':>10} {'decode':>7} {'gen':>7} {'obs':>7} {'total':>7} {'mean':>7}")
    for r in rows:
        for v in VARIANTS:
            s = r[v]
            print(f"{r['context_tokens']:>8} {v:>10} {s['decode_median_us']:>7.0f} {s['generation_median_us']:>7.0f} "
                  f"{s['observation_median_us']:>7.0f} {s['total_median_us']:>7.0f} {s['total_mean_us']:>7.0f}")
        print(f"{'':>8} {'ratio':>10} {'':>31} {r['median_ratio']:>7.2f} {r['mean_ratio']:>7.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"unit": "CPU microseconds per turn", "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
