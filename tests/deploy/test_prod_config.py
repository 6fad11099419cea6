"""deploy/prod.yaml: valid for T1 and DeepSpeed, and in step with the manifests and the real CLIs that run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from deploy_files import (
    DOCKER_DIR,
    PROD_YAML,
    REPO,
    K8sObject,
    parse_dockerfile,
    pod_spec,
    workloads,
)

from t1.cli.main import main as t1_main
from t1.config import ConfigError, load_config

SANDBOX_IMAGE_DIR = PurePosixPath("/opt/t1/deploy/sandbox")  # where coordinator.Dockerfile copies deploy/sandbox


def workload(objects: list[K8sObject], kind: str, name: str) -> tuple[K8sObject, dict[str, Any]]:
    (obj,) = [o for o in objects if o.kind == kind and o.name == name]
    (container,) = pod_spec(obj)["containers"]
    return obj, container


def flag(args: list[str], name: str) -> str:
    """The value after `name` in an argv, or of `name=value`."""
    for i, word in enumerate(args):
        if word == name:
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{name} missing from {args}")


def test_t1_config_check_accepts_prod(capsys: pytest.CaptureFixture[str]) -> None:
    assert t1_main(["config", "check", str(PROD_YAML)]) == 0
    assert "ok:" in capsys.readouterr().out


def test_prod_is_a_production_setup() -> None:
    cfg = load_config(PROD_YAML)
    assert cfg.sandbox.provider in {"command", "ssh"}
    assert not cfg.sandbox.command.insecure_skip_host_verification and cfg.sandbox.command.known_hosts
    assert cfg.inference.server.backend == "vllm" and cfg.inference.server.dtype == "bfloat16"
    assert len(cfg.inference.pool.endpoints) >= 2 and cfg.inference.pool.num_local_servers == 0
    assert cfg.inference.model.init_preset is None, "production must never create a random model"
    assert cfg.trainer.endpoint, "the trainer runs as its own Job, not inside the coordinator"
    assert cfg.coordinator.shard.count > 1, "coordinators run as shards"
    assert cfg.inference.pool.weights == "follow" and cfg.inference.server.follow_trainer == cfg.trainer.endpoint, (
        "with several coordinators the servers load each version themselves, from the trainer")
    assert cfg.auth.token is None and cfg.auth.token_env, "the token comes from the environment, not the file"
    assert cfg.metrics.port and cfg.metrics.host == "0.0.0.0"
    for server in (cfg.coordinator.server, cfg.inference.server.server, cfg.trainer.server):
        assert server.host == "0.0.0.0" and server.port > 0, "servers in pods bind every interface on a fixed port"
    eval_sets = [cfg.tasks.sets[name] for name in cfg.tasks.eval]
    assert eval_sets and all(s.split == "eval" and "terminal-bench-2" in str(s.path) for s in eval_sets)
    assert not set(cfg.tasks.train) & set(cfg.tasks.eval)
    assert int(cfg.inference.server.vllm_args["max_model_len"]) >= cfg.rollout.max_context_tokens


def test_prod_overrides_are_still_checked() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(PROD_YAML, ["inference.server.dtype=bf16"])
    assert any(line.startswith("inference.server.dtype:") for line in err.value.problems)


def test_deepspeed_section_is_a_valid_zero3_bf16_config(prod: dict[str, Any]) -> None:
    from deepspeed.runtime import constants
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION

    section = prod["trainer"]["deepspeed"]
    # DeepSpeed ignores unknown top-level keys (nested sections reject them), so check them here.
    known = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)} | {ZERO_OPTIMIZATION}
    assert set(section) <= known, f"keys DeepSpeed does not know: {sorted(set(section) - known)}"
    ds = DeepSpeedConfig(dict(section))
    assert ds.zero_optimization_stage == 3
    assert ds.bfloat16_config.enabled
    assert ds.zero_config.gather_16bit_weights_on_model_save, "publishing needs one 16-bit copy of the weights"
    assert "train_batch_size" not in prod["trainer"]["deepspeed"], "let DeepSpeed derive it from the world size"


def test_endpoints_name_the_cluster_services(prod: dict[str, Any], k8s_objects: list[K8sObject]) -> None:
    sts, _ = workload(k8s_objects, "StatefulSet", "t1-inference")
    port = prod["inference"]["server"]["server"]["port"]
    ns, svc = sts.body["metadata"]["namespace"], sts.body["spec"]["serviceName"]
    expected = [f"t1-inference-{i}.{svc}.{ns}.svc.cluster.local:{port}" for i in range(sts.body["spec"]["replicas"])]
    assert prod["inference"]["pool"]["endpoints"] == expected
    services = {o.name: o for o in k8s_objects if o.kind == "Service"}
    for name, section in (("t1-trainer", prod["trainer"]), ("t1-coordinator", prod["coordinator"])):
        ports = {p["name"]: p["port"] for p in services[name].body["spec"]["ports"]}
        assert ports["grpc"] == section["server"]["port"], name
    assert prod["trainer"]["endpoint"] == f"t1-trainer.t1.svc.cluster.local:{prod['trainer']['server']['port']}"


def test_config_flag_points_at_the_mounted_prod_yaml(k8s_objects: list[K8sObject]) -> None:
    configmaps = {o.name: o.body["data"] for o in k8s_objects if o.kind == "ConfigMap"}
    for obj in workloads(k8s_objects):
        spec = pod_spec(obj)
        (container,) = spec["containers"]
        config = PurePosixPath(flag(container["args"], "--config"))
        volumes = {v["name"]: v for v in spec["volumes"]}
        mount = next(m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == config.parent)
        data = configmaps[volumes[mount["name"]]["configMap"]["name"]]
        assert data[config.name] == PROD_YAML.read_text(encoding="utf-8"), obj.label


def test_inference_args_match_prod(prod: dict[str, Any], k8s_objects: list[K8sObject]) -> None:
    _, container = workload(k8s_objects, "StatefulSet", "t1-inference")
    args = container["args"]
    assert flag(args, "--backend") == prod["inference"]["server"]["backend"]
    assert flag(args, "--model") == prod["inference"]["model"]["path"]
    assert int(flag(args, "--port")) == prod["inference"]["server"]["server"]["port"]


def test_trainer_torchrun_matches_the_job(k8s_objects: list[K8sObject]) -> None:
    from torch.distributed.run import get_args_parser

    job, container = workload(k8s_objects, "Job", "t1-trainer")
    assert container["command"] == ["torchrun"]
    assert "--node-rank=$(NODE_RANK)" in container["args"], "the node rank must come from the completion index"
    # Kubernetes expands $(NODE_RANK) from the container env; pod 0 gets "0".
    args = [a.replace("$(NODE_RANK)", "0") for a in container["args"]]
    launch = get_args_parser().parse_args(args)
    spec = job.body["spec"]
    assert spec["completionMode"] == "Indexed"
    assert int(launch.nnodes) == spec["completions"] == spec["parallelism"]
    assert int(launch.nproc_per_node) == container["resources"]["limits"]["nvidia.com/gpu"]
    (rank_env,) = [e for e in container["env"] if e["name"] == "NODE_RANK"]
    assert "job-completion-index" in rank_env["valueFrom"]["fieldRef"]["fieldPath"]
    subdomain = pod_spec(job)["subdomain"]
    assert launch.master_addr == f"{job.name}-0.{subdomain}.{job.body['metadata']['namespace']}.svc.cluster.local"
    assert launch.master_port in {p["containerPort"] for p in container["ports"]}
    assert launch.no_python and launch.training_script == "t1-trainer"
    grace = pod_spec(job)["terminationGracePeriodSeconds"]
    assert launch.shutdown_timeout is not None and float(launch.shutdown_timeout) < grace, (
        "torchrun must give its workers time to checkpoint, and finish before the kubelet's SIGKILL"
    )


def _entry_argv(container: dict[str, Any]) -> list[str]:
    """The T1 command line a container runs, past tini or torchrun."""
    argv = list(container["command"]) + list(container.get("args", []))
    if argv[:2] == ["tini", "--"]:
        argv = argv[2:]
    if argv[0] == "torchrun":
        argv = argv[argv.index("--no-python") + 1 :]
    return argv


WORKLOADS = (("StatefulSet", "t1-coordinator"), ("StatefulSet", "t1-inference"), ("Job", "t1-trainer"))


@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_commands_are_real_entry_points(
    kind: str, name: str, k8s_objects: list[K8sObject], pyproject: dict[str, Any]
) -> None:
    obj, container = workload(k8s_objects, kind, name)
    argv = _entry_argv(container)
    assert argv[0] in pyproject["project"]["scripts"], f"{obj.label}: runs {argv[0]}, not a T1 console script"
    script = Path(sys.executable).parent / argv[0]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, f"{argv[0]} --help failed: {result.stderr[-500:]}"
    for word in argv[1:]:
        if word.startswith("--"):
            assert word.split("=")[0] in result.stdout, f"{obj.label}: {argv[0]} has no flag {word}"


def test_sandbox_scripts_ship_in_the_coordinator_image(prod: dict[str, Any]) -> None:
    command = prod["sandbox"]["command"]
    for argv in (command["create"], command["destroy"]):
        path = PurePosixPath(argv[0])
        assert path.is_relative_to(SANDBOX_IMAGE_DIR), f"{path} is not under {SANDBOX_IMAGE_DIR}"
        script = REPO / "deploy" / "sandbox" / path.relative_to(SANDBOX_IMAGE_DIR)
        assert script.is_file() and os.access(script, os.X_OK), f"{script} missing or not executable"
    assert "{id}" in command["destroy"]
    copies = [i.value.split() for i in parse_dockerfile(DOCKER_DIR / "coordinator.Dockerfile") if i.keyword == "COPY"]
    assert ["deploy/sandbox", str(SANDBOX_IMAGE_DIR)] in copies, "the coordinator image must carry deploy/sandbox"
