"""The GPU kit (bench/gpu/run.sh) as the GPU machine would run it, on the CPU with tiny shapes (--cpu):
every part runs and writes its JSON, the summary names each part's figures (slow suite: six processes that
each import torch, about 50 s; the default run dry-runs the model and the DeepSpeed PPO step, the parts that
depend most on the machine's build); a part past its limit is recorded as timed out and the kit goes on;
carried wheels are unpacked unless the machine has them."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import kit
from bench.gpu.install import install, wheel_name

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(out: Path, *args: str) -> tuple[dict[str, Any], str]:
    """run.sh --cpu with `args`: the summary, after checking every part it ran is ok with a headline."""
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(ROOT / "bench/gpu/run.sh"), "--cpu", *args], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"]
    for name, part in summary["parts"].items():
        assert part["status"] == "ok", (name, part, (out / "logs" / f"{name}.log").read_text()[-2000:])
        assert part["headline"] and not part["headline"].startswith("("), (name, part["headline"])
    table = proc.stdout[proc.stdout.index("T1 GPU kit on"):]
    assert all(name in table for name in summary["parts"])  # the summary table is printed last
    trainer = json.loads((out / "trainer.json").read_text())
    assert trainer["peak_memory_bytes"] > 0 and trainer["tokens_per_s"]["replay_on"] > 0
    return summary, table


def test_cpu_dry_run_of_the_deepspeed_step(tmp_path: Path) -> None:
    summary, _ = _dry_run(tmp_path / "out", "--only", "trainer")
    assert list(summary["parts"]) == ["model", "trainer"]  # the model the step trains is made first


@pytest.mark.slow
def test_cpu_dry_run_runs_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary, _ = _dry_run(out)
    assert list(summary["parts"]) == list(kit.PARTS)
    fidelity = json.loads((out / "fidelity_shape.json").read_text())
    assert fidelity["drift_tokens"] == 0
    assert fidelity["settings"]["layers"] == kit.CPU.layers and fidelity["settings"]["experts"] == kit.CPU.experts
    inference = json.loads((out / "inference.json").read_text())
    assert inference["model"] == str(out / "model")
    long_context = json.loads((out / "long_context.json").read_text())
    assert all(r["naive"]["fits"] and r["chunked"]["fits"] for r in long_context["rows"])


def test_a_part_past_its_limit_is_recorded_and_killed(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    r = kit.run_part("slow", ["sleep", "30"], 0.5, tmp_path)
    assert r["status"].startswith("timed out")
    assert r["seconds"] < 10
    assert kit.run_part("fails", ["false"], 10, tmp_path)["status"] == "exit 1"


def _wheel(folder: Path, name: str, version: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}_mod/__init__.py", "X = 1\n")
    return path


def test_wheels_unpack_unless_the_machine_has_them(tmp_path: Path) -> None:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "t1_kit_absent_pkg", "1.0")
    _wheel(wheels, "numpy", "0.1")  # older than the installed numpy: the machine's stays
    lines = install(wheels, site)
    assert (site / "t1_kit_absent_pkg_mod" / "__init__.py").exists()
    assert not (site / "numpy_mod").exists()
    assert any(ln.startswith("kept    numpy") for ln in lines)
    assert wheel_name(Path("deepspeed-0.19.8-py3-none-any.whl")) == ("deepspeed", "0.19.8")


def test_gpu_command_lines_use_flags_the_scripts_define(tmp_path: Path) -> None:
    """The GPU shape's arguments never run here: each flag must still be one its script defines."""
    from bench.fidelity.cli import parser

    cmds = kit.commands(kit.GPU, tmp_path)
    fid = parser().parse_args(cmds["fidelity_shape"][3:])
    assert (fid.layers, fid.experts, fid.top_k, fid.device) == (kit.GPU.layers, kit.GPU.experts, kit.GPU.top_k, "cuda")
    for name in ("model", "inference", "trainer", "long_context"):
        script = ROOT / cmds[name][1]
        source = script.read_text()
        unknown = [a for a in cmds[name] if a.startswith("--") and f'"{a}"' not in source]
        assert not unknown, (name, unknown)
    assert sum(kit.GPU.limits_s.values()) <= 575  # the whole run inside one 600-s device call
