"""Which copies a policy gets right: the probability it gives each sampled token that repeats a token shown before
it, split by whether the token before the copy is the same as before the shown one (an induction copy: `out` `/bee`
shown, `out` `/bee` typed) or not (` plum` shown after ` write`, typed after ` echo`), and each kind by how far back
it was last shown (`near` under `--far-tokens`, `far` from there: a model may copy only from close by).

    python -m bench.copy_probe --weights RUN/trainer/weights/v1500 --trajectories RUN/run/demos.msgpack \
        --episodes 40 --out FILE

Read over an episode file (the demonstrations, or any spool file of trajectories), every `--stride`th one, with the
policy at `--weights`; a sampled token counts as a copy when it appears earlier in the segment outside the sampled
tokens, and not when it was already typed after the same token (that one the policy may repeat from its own turn).
Also the words whose sampled tokens get the lowest mean probability. docs/learning.md (the long run) reads it.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine_info import machine

INDUCTION, OTHER = "induction", "other_predecessor"


def copy_kinds(token_ids: np.ndarray, sampled: np.ndarray) -> dict[int, tuple[str, int]]:
    """Position -> (kind, tokens back to where it was last shown), for each sampled position whose token was shown
    before it (see the module docstring)."""
    kinds: dict[int, tuple[str, int]] = {}
    for pos in np.nonzero(sampled)[0]:
        if pos == 0:
            continue
        tid, prev = token_ids[pos], token_ids[pos - 1]
        before = np.nonzero(token_ids[1:pos] == tid)[0] + 1
        shown = before[~sampled[before]]
        if shown.size == 0:
            continue
        typed = before[sampled[before]]
        if (token_ids[typed - 1] == prev).any():
            continue
        kinds[int(pos)] = (INDUCTION if (token_ids[shown - 1] == prev).any() else OTHER, int(pos - shown[-1]))
    return kinds


def probe(weights: Path, trajectories: Path, episodes: int, stride: int, far_tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t1.trajectory.serialization import iter_trajectories

    model = AutoModelForCausalLM.from_pretrained(str(weights)).eval()
    tok = AutoTokenizer.from_pretrained(str(weights))
    probs: dict[tuple[str, str], list[float]] = defaultdict(list)  # (kind, near or far) -> p of each copy
    words: dict[str, list[float]] = defaultdict(list)
    with trajectories.open("rb") as fh:
        picked = list(itertools.islice(iter_trajectories(fh), 0, episodes * stride, stride))  # reads no further
    for traj in picked:
        for seg in traj.segments:
            ids = seg.token_ids.astype(np.int64)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.from_numpy(ids[None])).logits[0, :-1].float(), -1)
            p = logp[torch.arange(len(ids) - 1), torch.from_numpy(ids[1:])].exp().numpy()  # p[i]: token i + 1
            for pos, (kind, back) in copy_kinds(ids, np.asarray(seg.loss_mask, bool)).items():
                probs[kind, "far" if back >= far_tokens else "near"].append(float(p[pos - 1]))
            for i in np.nonzero(seg.loss_mask)[0]:
                if i > 0:
                    words[str(tok.decode([int(ids[i])])).strip()].append(float(p[i - 1]))

    def summary(values: list[float]) -> dict[str, Any]:
        v = np.asarray(values)
        return {"tokens": int(v.size), "mean_p": round(float(v.mean()), 4) if v.size else None,
                "share_below_half": round(float((v < 0.5).mean()), 4) if v.size else None}

    lowest = sorted((float(np.mean(v)), w, len(v)) for w, v in words.items() if len(v) >= 5 and w)[:20]
    by_kind = {kind: {**summary(probs[kind, "near"] + probs[kind, "far"]), "near": summary(probs[kind, "near"]),
                      "far": summary(probs[kind, "far"])} for kind in (INDUCTION, OTHER)}
    return {"episodes": len(picked), "far_tokens": far_tokens, **by_kind,
            "lowest_words": [{"word": w, "tokens": n, "mean_p": round(m, 4)} for m, w, n in lowest]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--weights", type=Path, required=True, help="a published weights folder (model and tokenizer)")
    p.add_argument("--trajectories", type=Path, required=True, help="demos.msgpack or a spool file")
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--stride", type=int, default=20, help="read every stride-th episode of the file")
    p.add_argument("--far-tokens", type=int, default=120, help="a copy shown at least this many tokens back is far")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    for path in (args.weights, args.trajectories):
        if not path.exists():
            p.error(f"{path} does not exist")
    result = {"machine": machine(), "weights": str(args.weights), "trajectories": str(args.trajectories),
              **probe(args.weights, args.trajectories, args.episodes, args.stride, args.far_tokens)}
    print(f"{'copy':<26}{'tokens':>8}{'mean p':>9}{'p < 0.5':>9}")
    for kind in (INDUCTION, OTHER):
        for label, r in ((kind, result[kind]), (f"  near (< {args.far_tokens} back)", result[kind]["near"]),
                         ("  far", result[kind]["far"])):
            print(f"{label:<26}{r['tokens']:>8}{r['mean_p'] if r['mean_p'] is not None else '-':>9}"
                  f"{r['share_below_half'] if r['share_below_half'] is not None else '-':>9}")
    print("lowest words:", ", ".join(f"{w['word']} {w['mean_p']:.2f}" for w in result["lowest_words"][:10]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
