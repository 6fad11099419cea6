"""The config schema and loader: strict keys, key-path errors, overrides, no torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from t1.config import ConfigError, load_config, validate
from t1.config.loader import apply_overrides
from t1.config.reference import embedded_reference, reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def _t1(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "t1.cli.main", *args], capture_output=True, text=True, cwd=ROOT)


def test_defaults_validate():
    cfg = load_config(None)
    assert cfg.rollout.max_turns == 400
    assert cfg.sandbox.provider == "local"


@pytest.mark.parametrize("name", ["examples/local.yaml", "examples/long.yaml", "deploy/prod.yaml"])
def test_shipped_configs_validate(name):
    result = _t1("config", "check", name)
    assert result.returncode == 0, result.stderr
    assert f"ok: {name}" in result.stdout


def test_unknown_key_exits_2_with_its_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  max_turnz: 10\n")
    result = _t1("config", "check", str(bad))
    assert result.returncode == 2
    assert "rollout.max_turnz: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_problem_is_reported_with_its_path():
    with pytest.raises(ConfigError) as err:
        validate({"rollout": {"max_turns": 0, "sampling": {"top_p": 2}}, "sandbox": {"pool": {"max_sandboxes": "x"}},
                  "trainer": {"rl": {"gamma": "high"}}, "tasks": {"sets": {"a": {}}}})
    paths = sorted(line.split(":")[0] for line in err.value.problems)
    assert paths == ["rollout.max_turns", "rollout.sampling.top_p", "sandbox.pool.max_sandboxes", "tasks.sets.a.path",
                     "trainer.rl.gamma"]


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nope.yaml")
    assert "no such file" in err.value.problems[0]
    broken = tmp_path / "broken.yaml"
    broken.write_text("rollout: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(broken)
    assert "invalid YAML" in err.value.problems[0]
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


def test_missing_tls_files_are_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(
            {
                "auth": {
                    "tls": {"enabled": True, "cert_file": str(tmp_path / "c.pem"), "key_file": str(tmp_path / "k.pem")}
                }
            }
        )
    assert any(line.startswith("auth.tls.cert_file: file not found") for line in err.value.problems)


def test_undefined_task_set_is_an_error():
    with pytest.raises(ConfigError) as err:
        validate({"tasks": {"train": ["missing"]}})
    assert "set 'missing' is used but not defined" in err.value.problems[0]


def test_warm_start_sets_must_be_task_sets():
    sets = {"sets": {"a": {"path": "x", "split": "train"}}, "train": ["a"]}
    for field, value in (("demo_sets", ["a", "nope"]), ("sft_validation_set", "nope")):
        with pytest.raises(ConfigError) as err:
            validate({"tasks": sets, "trainer": {"warm_start": {field: value}}})
        assert any(f"trainer.warm_start.{field}: 'nope' is not in tasks.sets (known: a)" in p
                   for p in err.value.problems), err.value.problems
    assert validate({"tasks": sets, "trainer": {"warm_start": {"demo_sets": ["a"]}}}).trainer.warm_start.demo_sets == [
        "a"
    ]


def test_overrides_apply_typed_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  max_turns: 10\n")
    cfg = load_config(
        path, ["rollout.max_turns=50", "rollout.sampling.temperature=0.7", "trainer.rl.routing_replay=false"]
    )
    assert cfg.rollout.max_turns == 50
    assert cfg.rollout.sampling.temperature == 0.7
    assert cfg.trainer.rl.routing_replay is False
    with pytest.raises(ConfigError, match=r"expected KEY\.PATH=VALUE"):
        load_config(path, ["rollout.max_turns"])
    with pytest.raises(ConfigError, match=r"rollout\.max_turnz: unknown key"):
        load_config(path, ["rollout.max_turnz=3"])
    with pytest.raises(ConfigError, match="is not a mapping"):
        apply_overrides({"rollout": {"max_turns": 3}}, ["rollout.max_turns.x=1"])


def test_schema_imports_without_torch():
    code = "import sys, t1.config, t1.cli.main; t1.cli.main.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_readme_config_reference_is_current():
    readme = (ROOT / "README.md").read_text()
    assert embedded_reference(readme) == reference_markdown(), "regenerate with `t1 config reference`"


def test_training_refuses_truncated_sampling():
    with pytest.raises(ConfigError) as err:
        validate({"rollout": {"sampling": {"top_p": 0.9}}})
    assert err.value.problems[0].startswith("rollout.sampling: top_p must be 1.0")
    cfg = validate({"rollout": {"sampling": {"top_p": 0.9}}, "coordinator": {"train": False}})
    assert cfg.rollout.sampling.top_p == 0.9
