"""The container images: pip installs match pyproject, bases are pinned, copies and ports line up with k8s."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_files import (
    DOCKER_DIR,
    HADOLINT,
    REPO,
    Instruction,
    K8sObject,
    parse_dockerfile,
    pip_install_args,
    pod_spec,
    workloads,
)
from packaging.requirements import Requirement

IMAGES = ("coordinator", "inference", "trainer")
_PROJECT_REQ = re.compile(r"^\.(\[(?P<extras>[A-Za-z0-9_,-]+)\])?$")


def dockerfile(image: str) -> Path:
    return DOCKER_DIR / f"{image}.Dockerfile"


def instructions(image: str, keyword: str) -> list[Instruction]:
    return [i for i in parse_dockerfile(dockerfile(image)) if i.keyword == keyword]


def pinned_requirements(pyproject: dict[str, Any]) -> dict[str, str]:
    """Name -> specifier of every dependency pyproject declares, base and extras alike."""
    reqs = list(pyproject["project"]["dependencies"])
    for extra in pyproject["project"]["optional-dependencies"].values():
        reqs.extend(extra)
    return {Requirement(r).name.lower(): str(Requirement(r).specifier) for r in reqs}


def base_image(image: str) -> str:
    """The FROM image with ARG defaults substituted."""
    args = {}
    for ins in parse_dockerfile(dockerfile(image)):
        if ins.keyword == "ARG" and "=" in ins.value:
            name, _, default = ins.value.partition("=")
            args[name] = default
        if ins.keyword == "FROM":
            return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ins.value.split()[0])
    raise AssertionError(f"{image}: no FROM")


def exposed_ports(image: str) -> set[int]:
    return {int(p.split("/")[0]) for ins in instructions(image, "EXPOSE") for p in ins.value.split()}


def entrypoint_words(image: str) -> list[str]:
    (entry,) = instructions(image, "ENTRYPOINT")
    words = json.loads(entry.value)
    assert isinstance(words, list), f"{image}: ENTRYPOINT must be the exec (JSON) form so signals reach the process"
    return words


@pytest.mark.parametrize("image", IMAGES)
def test_pip_installs_match_pyproject(image: str, pyproject: dict[str, Any]) -> None:
    pins = pinned_requirements(pyproject)
    extras = set(pyproject["project"]["optional-dependencies"])
    installs = [reqs for ins in instructions(image, "RUN") for reqs in pip_install_args(ins.value)]
    assert installs, f"{image}: no pip install step"
    installs_project = False
    for reqs in installs:
        assert reqs, f"{image}: a pip install without requirements"
        for req in reqs:
            project = _PROJECT_REQ.match(req)
            if project:
                installs_project = True
                wanted = set((project.group("extras") or "").split(",")) - {""}
                assert wanted <= extras, f"{image}: extras {sorted(wanted - extras)} are not in pyproject"
                continue
            parsed = Requirement(req)
            name = parsed.name.lower()
            assert name in pins, f"{image}: installs {name}, which pyproject does not declare"
            assert str(parsed.specifier) == pins[name], f"{image}: {req!r} but pyproject says {name}{pins[name]}"
    assert installs_project, f"{image}: never installs the t1 project itself (`pip install .`)"


def test_pip_parser_sees_a_mismatch(pyproject: dict[str, Any]) -> None:
    pins = pinned_requirements(pyproject)
    (reqs,) = pip_install_args('A=1 pip install --extra-index-url https://x "torch==2.12.0" && echo "a;b"')
    assert reqs == ["torch==2.12.0"]
    assert str(Requirement(reqs[0]).specifier) != pins["torch"]


@pytest.mark.parametrize("image", IMAGES)
def test_base_image_is_pinned(image: str) -> None:
    base = base_image(image)
    name, _, tag = base.rpartition(":")
    assert name and tag and tag != "latest" and "/" not in tag, f"{image}: base {base!r} has no fixed tag"


def test_inference_base_is_the_pinned_vllm(pyproject: dict[str, Any]) -> None:
    vllm = Requirement(pyproject["project"]["optional-dependencies"]["vllm"][0])
    (spec,) = vllm.specifier
    assert spec.operator == "==", "the vllm extra must pin one version for the base image to match"
    assert base_image("inference").endswith(f":v{spec.version}")


@pytest.mark.parametrize("image", IMAGES)
def test_copy_sources_exist(image: str) -> None:
    for ins in instructions(image, "COPY"):
        words = [w for w in ins.value.split() if not w.startswith("--")]
        for src in words[:-1]:
            assert (REPO / src).exists(), f"{image}: COPY source {src} is not in the repository"


@pytest.mark.parametrize("image", IMAGES)
def test_dockerignore_keeps_secrets_out(image: str) -> None:
    ignore = dockerfile(image).with_name(f"{image}.Dockerfile.dockerignore")
    patterns = set(ignore.read_text(encoding="utf-8").split())
    assert {"deploy/secrets", ".venv", ".git"} <= patterns


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_a_console_script(image: str, pyproject: dict[str, Any]) -> None:
    words = entrypoint_words(image)
    scripts = set(pyproject["project"]["scripts"])
    launchers = {"tini": ["--"], "torchrun": ["--no-python"]}
    while words and words[0] in launchers:
        words = [w for w in words[1:] if w not in launchers[words[0]]]
    assert words and words[0] in scripts, f"{image}: ENTRYPOINT runs {words[:1]}, not one of {sorted(scripts)}"


@pytest.mark.parametrize("image", IMAGES)
def test_k8s_uses_each_image_with_exposed_ports(image: str, k8s_objects: list[K8sObject]) -> None:
    ports: set[int] = set()
    used = False
    for obj in workloads(k8s_objects):
        for container in pod_spec(obj)["containers"]:
            if container["image"].split(":")[0] == f"t1-{image}":
                used = True
                ports |= {p["containerPort"] for p in container.get("ports", [])}
    assert used, f"no manifest runs the t1-{image} image"
    assert ports <= exposed_ports(image), (f"{image}: container ports {sorted(ports - exposed_ports(image))} are not "
                                           "EXPOSEd")


def test_kustomize_images_cover_every_dockerfile(kustomization: dict[str, Any]) -> None:
    named = {entry["name"] for entry in kustomization["images"]}
    assert named == {f"t1-{image}" for image in IMAGES}
    assert {p.name for p in DOCKER_DIR.glob("*.Dockerfile")} == {f"{image}.Dockerfile" for image in IMAGES}


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [HADOLINT, "--no-color", "--config", str(DOCKER_DIR / "hadolint.yaml"), str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_passes(image: str) -> None:
    result = hadolint(dockerfile(image))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_an_unpinned_base(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN pip install requests\n", encoding="utf-8")
    result = hadolint(bad)
    assert result.returncode != 0 and "DL3007" in result.stdout
