"""deploy/sandbox/k8s_pod_sandbox.sh: its pod manifest (no cluster here: the script itself is untested against one)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "deploy" / "sandbox" / "k8s_pod_sandbox.sh"


def test_pod_manifest_follows_the_plan(tmp_path: Path) -> None:
    (tmp_path / "key.pub").write_text("ssh-ed25519 AAAAtest t1\n")
    env = {**os.environ, "T1_IMAGE": "t1-task:1", "T1_CPUS": "1.5", "T1_MEMORY_MB": "2048", "T1_ALLOW_NETWORK": "0",
           "T1_K8S_SSHD_IMAGE": "t1-sshd:1", "T1_SSH_KEY": str(tmp_path / "key"), "T1_K8S_RUN": "run-7"}
    out = subprocess.run(["bash", str(SCRIPT), "spec", "t1-sb-x"], env=env, capture_output=True, text=True, check=True)
    pod = json.loads(out.stdout)
    assert pod["metadata"]["labels"] == {"t1.sandbox": "t1-sb-x", "t1.run": "run-7",
                                         "t1.coordinator": os.uname().nodename, "t1.internet": "false"}
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    task, sshd = spec["containers"]
    assert task["image"] == "t1-task:1" and task["command"] == ["sleep", "infinity"]
    assert task["resources"]["requests"] == task["resources"]["limits"] == {"cpu": "1.5", "memory": "2048Mi"}
    assert sshd["env"][0]["value"] == "ssh-ed25519 AAAAtest t1"
    bad = subprocess.run(["bash", str(SCRIPT), "spec"], env={**env, "T1_K8S_SSHD_IMAGE": ""},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "T1_K8S_SSHD_IMAGE" in bad.stderr
