"""Every Kubernetes object under deploy/ passes the official schemas and hangs together with its neighbours."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from deploy_files import (
    DEPLOY,
    K8S_VERSIONS,
    REPO,
    K8sObject,
    load_kustomization,
    manifest_objects,
    pod_labels,
    pod_spec,
    workloads,
)

T1_SERVICES = {"t1.v1.CoordinatorService", "t1.v1.InferenceService", "t1.v1.TrainerService"}
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")


def containers(objects: list[K8sObject]) -> Iterator[tuple[K8sObject, dict[str, Any]]]:
    for obj in workloads(objects):
        for container in pod_spec(obj)["containers"]:
            yield obj, container


def find(objects: list[K8sObject], kind: str, name: str) -> K8sObject:
    matches = [o for o in objects if o.kind == kind and o.name == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def test_kustomization_lists_every_manifest(kustomization: dict[str, Any]) -> None:
    listed = sorted(kustomization["resources"])
    on_disk = sorted(str(p.relative_to(DEPLOY)) for p in (DEPLOY / "k8s").glob("*.yaml"))
    assert listed == on_disk


def test_every_manifest_parses(kustomization: dict[str, Any]) -> None:
    written = manifest_objects(kustomization)
    assert len(written) >= 15
    for obj in written:
        assert {"apiVersion", "kind", "metadata"} <= set(obj.body), obj.label
        assert obj.body["metadata"].get("name"), obj.label
        if obj.kind != "Namespace":
            assert obj.body["metadata"].get("namespace") == kustomization["namespace"], f"{obj.label}: wrong namespace"


def test_kustomize_builds_generated_objects_and_rewrites_references(k8s_objects: list[K8sObject]) -> None:
    generated = {o.name for o in k8s_objects if o.kind in {"ConfigMap", "Secret"}}
    assert {name.rsplit("-", 1)[0] for name in generated} == {"t1-config", "t1-api-token", "t1-sandbox-ssh"}
    for obj in workloads(k8s_objects):
        for vol in pod_spec(obj).get("volumes", []):
            ref = vol.get("configMap", {}).get("name") or vol.get("secret", {}).get("secretName")
            assert ref is None or ref in generated, f"{obj.label}: volume {vol['name']} names {ref}"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_matches_the_kubernetes_schema(version: str, k8s_objects: list[K8sObject]) -> None:
    for obj in k8s_objects:
        try:
            kubernetes_validate.validate(obj.body, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj.label} (k8s {version}): {path}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            pytest.fail(f"{obj.label}: {err.message}")


def test_schema_check_rejects_a_misspelled_field() -> None:
    workload = next(o for o in manifest_objects(load_kustomization()) if o.kind == "StatefulSet")
    body = copy.deepcopy(workload.body)
    body["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["servce"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(body, K8S_VERSIONS[0], strict=True)


def test_resource_quantities_are_valid(k8s_objects: list[K8sObject]) -> None:
    for obj, container in containers(k8s_objects):
        for bound in ("requests", "limits"):
            for name, value in container.get("resources", {}).get(bound, {}).items():
                assert _QUANTITY.match(str(value)), f"{obj.label}: {bound}.{name}={value!r} is not a quantity"
    for obj in k8s_objects:
        if obj.kind == "PersistentVolumeClaim":
            assert _QUANTITY.match(obj.body["spec"]["resources"]["requests"]["storage"]), obj.label


def test_references_resolve(k8s_objects: list[K8sObject]) -> None:
    names = {(o.kind, o.name) for o in k8s_objects}
    secret_keys = {o.name: set(o.body["data"]) for o in k8s_objects if o.kind == "Secret"}
    for obj in workloads(k8s_objects):
        spec = pod_spec(obj)
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in names, obj.label
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = {t["metadata"]["name"] for t in obj.body["spec"].get("volumeClaimTemplates", [])}
        for vol in volumes.values():
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names, f"{obj.label}: volume {vol['name']}"
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in names, f"{obj.label}: volume {vol['name']}"
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names, obj.label
        if "subdomain" in spec:
            assert ("Service", spec["subdomain"]) in names, f"{obj.label}: subdomain has no headless Service"
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in templates, (
                    f"{obj.label}: mount {mount['name']} has no volume")
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secret_keys.get(ref["name"], set()), f"{obj.label}: env {env['name']}"


def test_services_select_pods_with_their_ports(k8s_objects: list[K8sObject]) -> None:
    for svc in (o for o in k8s_objects if o.kind == "Service"):
        selector = svc.body["spec"]["selector"]
        selected = [w for w in workloads(k8s_objects) if selector.items() <= pod_labels(w).items()]
        assert selected, f"{svc.label}: selector {selector} matches no pod template"
        for workload in selected:
            ports = [p for c in pod_spec(workload)["containers"] for p in c.get("ports", [])]
            by_name = {p["name"]: p["containerPort"] for p in ports if "name" in p}
            for port in svc.body["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert target in by_name or target in by_name.values(), f"{svc.label}: targetPort {target}"


def test_statefulset_and_job_have_their_headless_services(k8s_objects: list[K8sObject]) -> None:
    for obj in workloads(k8s_objects):
        service_name = obj.body["spec"].get("serviceName") if obj.kind == "StatefulSet" else None
        if obj.kind == "Job":
            service_name = pod_spec(obj).get("subdomain")
        if service_name:
            svc = find(k8s_objects, "Service", service_name)
            assert svc.body["spec"].get("clusterIP") == "None", f"{svc.label} must be headless"


def test_long_running_servers_have_grpc_health_probes(k8s_objects: list[K8sObject]) -> None:
    checked = 0
    for obj, container in containers(k8s_objects):
        if obj.kind not in {"Deployment", "StatefulSet"}:
            continue
        ports = {p["containerPort"] for p in container["ports"]}
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(probe_name)
            assert probe and "grpc" in probe, f"{obj.label}: {probe_name} must use the gRPC health service"
            assert probe["grpc"]["port"] in ports, f"{obj.label}: {probe_name} port is not a container port"
        assert container["readinessProbe"]["grpc"].get("service") in T1_SERVICES, obj.label
        checked += 1
    assert checked == 2


def test_every_workload_is_scraped_by_prometheus(k8s_objects: list[K8sObject], prod: dict[str, Any]) -> None:
    metrics_port = prod["metrics"]["port"]
    for obj, container in containers(k8s_objects):
        annotations = obj.body["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", obj.label
        assert annotations.get("prometheus.io/port") == str(metrics_port), obj.label
        assert annotations.get("prometheus.io/path") == "/metrics", obj.label
        named = {p.get("name"): p["containerPort"] for p in container["ports"]}
        assert named.get("metrics") == metrics_port, f"{obj.label}: no 'metrics' port {metrics_port}"


def test_coordinators_are_shards_with_a_volume_each_and_enough_grace(k8s_objects: list[K8sObject],
                                                                     prod: dict[str, Any]) -> None:
    sts = find(k8s_objects, "StatefulSet", "t1-coordinator")
    coordinator = prod["coordinator"]
    assert sts.body["spec"]["replicas"] == coordinator["shard"]["count"], "one pod per shard"
    spec = pod_spec(sts)
    (container,) = spec["containers"]
    assert "coordinator.shard.index=$(T1_SHARD_INDEX)" in container["args"]
    (index_env,) = [e for e in container["env"] if e["name"] == "T1_SHARD_INDEX"]
    assert index_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    # The episodes' grace, the 5 s the driver adds before it abandons a stage, then the teardown's bound.
    assert (
        spec["terminationGracePeriodSeconds"] > coordinator["shutdown_grace_s"] + 5 + coordinator["shutdown_timeout_s"]
    )
    (claim,) = sts.body["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"], "one writer per shard's volume"
    assert claim["metadata"]["name"] not in {v["name"] for v in spec["volumes"]}, "the template, not a shared claim"
    data = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert coordinator["run_dir"].startswith(data["mountPath"] + "/"), "run_dir is not on the shard's volume"
    assert sts.body["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain", (
        "a shard scaled away keeps its unacknowledged spool")


def test_gpu_workloads_request_whole_nodes(k8s_objects: list[K8sObject], prod: dict[str, Any]) -> None:
    tensor_parallel = prod["inference"]["server"]["vllm_args"]["tensor_parallel_size"]
    for obj, container in containers(k8s_objects):
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
        if gpus is None:
            continue
        spec = pod_spec(obj)
        assert spec.get("nodeSelector"), f"{obj.label}: GPU pods need a nodeSelector"
        assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), obj.label
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus, obj.label
        if obj.kind == "StatefulSet":
            assert gpus == tensor_parallel, "each vLLM replica must own exactly tensor_parallel_size GPUs"


def test_secret_files_are_never_committed() -> None:
    for name in ("api-token", "sandbox_ed25519"):
        result = subprocess.run(
            ["git", "check-ignore", "-q", f"deploy/secrets/{name}"], cwd=REPO, check=False, capture_output=True
        )
        assert result.returncode == 0, f"deploy/secrets/{name} is not ignored by git"


def test_network_policies_cover_every_workload_on_real_ports(k8s_objects: list[K8sObject]) -> None:
    running = workloads(k8s_objects)
    covered = set()
    for policy in (o for o in k8s_objects if o.kind == "NetworkPolicy"):
        selector = policy.body["spec"]["podSelector"]["matchLabels"]
        selected = [w for w in running if selector.items() <= pod_labels(w).items()]
        assert selected, f"{policy.label}: selects no pods"
        for workload in selected:
            covered.add(workload.name)
            ports = {p["containerPort"] for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
            for rule in policy.body["spec"]["ingress"]:
                for port in rule.get("ports", []):
                    assert port["port"] in ports, (f"{policy.label}: port {port['port']} is not a port of "
                                                   f"{workload.label}")
    assert covered == {w.name for w in running}
