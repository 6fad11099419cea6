"""The smoke-run shape on the real Qwen3 vocabulary: the `qwen3-vocab` preset (151,936 embedding rows,
Qwen3's own chat template) with thinking off, through the coordinator: eval jobs, warm start, one PPO
step, drift 0, template mismatches counted (Qwen3 thinking off rewrites the empty think block of every
turn it renders again), no infra error."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from smoke_run import RUN_TIMEOUT_S, small_config, start_coordinator


@pytest.mark.slow  # the model's tokenizer build and the 151,936-row forward passes: several minutes here
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_qwen3_vocab_trains_through_the_coordinator_with_thinking_off() -> None:
    root = Path(tempfile.mkdtemp(prefix="t1-qwen3-vocab-"))
    root.chmod(0o711)  # sandbox users must traverse to their trees
    try:
        cfg = small_config(root, root / "model")
        cfg["inference"]["model"].update(init_preset="qwen3-vocab", chat_template_kwargs={"enable_thinking": False})
        proc, out = start_coordinator(root, cfg)
        try:
            rc = proc.wait(2 * RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        log = out.read_text(errors="replace")
        assert rc == 0, log[-6000:]
        assert json.loads((root / "model" / "config.json").read_text())["vocab_size"] == 151_936
        report = json.loads((root / "run" / "report.json").read_text())
        for label in ("base", "warm_start", "rl"):
            assert report[label]["heldout"]["num_tasks"] == 1 and report[label]["heldout"]["infra_errors"] == 0
        assert report["trainer"]["stage"] == "done" and report["trainer"]["step"] == 3, report["trainer"]
        assert report["rollouts"]["infra_errors"] == 0 and report["rollouts"]["episodes"] > 0
        fid = report["fidelity"]
        assert fid["t1_tito_drift_tokens"] == 0
        # Thinking off: every observation after a turn is a generation_prompt mismatch, counted and repaired.
        assert 0 < fid["t1_tito_template_mismatches"] <= report["rollouts"]["turns"]
        assert 0.0 <= fid["t1_retokenize_mismatch_rate"] <= 1.0
        print("qwen3-vocab run:", json.dumps({"fidelity": fid, "rollouts": report["rollouts"]}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
