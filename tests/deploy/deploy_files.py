"""Readers for the deploy/ tests: manifests as written and as kustomize builds them, Dockerfiles, pip install lines."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
PROD_YAML = DEPLOY / "prod.yaml"
DOCKER_DIR = DEPLOY / "docker"
# kubectl (with its built-in kustomize) and hadolint come as wheels in the dev extra.
BIN_DIR = Path(sys.executable).parent
KUBECTL = str(BIN_DIR / "kubectl")
HADOLINT = str(BIN_DIR / "hadolint")

# Oldest Kubernetes release the manifests target (Indexed Job pod labels need 1.28,
# gRPC probes are GA since 1.27) and the newest whose schemas the validator ships.
K8S_VERSIONS = ("1.30", "1.37")

POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet", "ReplicaSet"}


@dataclass(frozen=True, slots=True)
class K8sObject:
    """One Kubernetes object and where it came from (a manifest file or the kustomize build)."""

    source: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def label(self) -> str:
        return f"{self.source}:{self.kind}/{self.name}"


def load_kustomization() -> dict[str, Any]:
    return yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))


def _file_entry(entry: str) -> tuple[str, str]:
    """A generator `files:` entry, `key=path` or `path`, as (key, path)."""
    key, sep, path = entry.partition("=")
    return (key, path) if sep else (Path(entry).name, entry)


def kustomize_build(work_dir: Path) -> list[K8sObject]:
    """What `kubectl apply -k deploy/` would send: the real kustomize build of a copy of deploy/.

    The Secret source files are never committed, so the copy gets stand-ins for them.
    """
    copy = work_dir / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("secrets"))
    (copy / "secrets").mkdir()
    for gen in load_kustomization().get("secretGenerator", []):
        for _, path in map(_file_entry, gen["files"]):
            (copy / path).write_text("stand-in for a file under deploy/secrets\n", encoding="utf-8")
    result = subprocess.run([KUBECTL, "kustomize", str(copy)], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize deploy/ failed: {result.stderr}"
    return [K8sObject("kustomize build", doc) for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def manifest_objects(kust: dict[str, Any]) -> list[K8sObject]:
    objects = []
    for rel in kust["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / rel).read_text(encoding="utf-8")):
            if doc is not None:
                objects.append(K8sObject(rel, doc))
    return objects


def workloads(objects: list[K8sObject]) -> list[K8sObject]:
    """The objects that run pods (they have a pod template)."""
    return [o for o in objects if o.kind in POD_TEMPLATE_KINDS]


def pod_spec(obj: K8sObject) -> dict[str, Any]:
    assert obj.kind in POD_TEMPLATE_KINDS, f"{obj.label} has no pod template"
    spec: dict[str, Any] = obj.body["spec"]["template"]["spec"]
    return spec


def pod_labels(obj: K8sObject) -> dict[str, str]:
    """Labels the pods of a workload carry, including the ones the Job controller adds."""
    labels = dict(obj.body["spec"]["template"]["metadata"].get("labels", {}))
    if obj.kind == "Job":
        labels["job-name"] = obj.name
        if obj.body["spec"].get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = "0"  # pod 0; others get their own index
    return labels


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction with its continuation lines joined."""

    keyword: str
    value: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, value = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip()))
    assert not pending, f"{path}: dangling line continuation"
    return instructions


_PIP_VALUE_OPTIONS = {
    "-i",
    "--index-url",
    "--extra-index-url",
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-f",
    "--find-links",
}


def shell_commands(run_value: str) -> list[list[str]]:
    """A RUN line as its simple commands: words split like sh does, at `;`, `&&`, `||` and `|`."""
    lexer = shlex.shlex(run_value, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {";", "&&", "||", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def pip_install_args(run_value: str) -> list[list[str]]:
    """The requirement arguments of every `pip install` in a RUN command (options dropped)."""
    installs = []
    for command in shell_commands(run_value):
        words = _strip_env_assignments(command)
        if "pip" not in words or "install" not in words:
            continue
        rest = words[words.index("install") + 1 :]
        reqs, skip = [], False
        for word in rest:
            if skip:
                skip = False
            elif word in _PIP_VALUE_OPTIONS:
                skip = True
            elif not word.startswith("-"):
                reqs.append(word)
        installs.append(reqs)
    return installs


def _strip_env_assignments(words: list[str]) -> list[str]:
    """Drop leading `NAME=value` words (environment for the command that follows)."""
    i = 0
    while i < len(words) and "=" in words[i] and words[i].split("=", 1)[0].isidentifier():
        i += 1
    return words[i:]
