"""Session fixtures of the deploy/ tests: pyproject, prod.yaml, and every Kubernetes object kustomize would apply."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml
from deploy_files import PROD_YAML, REPO, K8sObject, kustomize_build, load_kustomization


@pytest.fixture(scope="session")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def prod() -> dict[str, Any]:
    return yaml.safe_load(PROD_YAML.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def kustomization() -> dict[str, Any]:
    return load_kustomization()


@pytest.fixture(scope="session")
def k8s_objects(tmp_path_factory: pytest.TempPathFactory) -> list[K8sObject]:
    return kustomize_build(tmp_path_factory.mktemp("kustomize"))
